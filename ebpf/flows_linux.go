package ebpf

import (
	"errors"
	"fmt"
	"net/netip"

	bpf "github.com/cilium/ebpf"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// The flow table (flows, drop_seen): cutting the established flows that a policy
// change, Forget or Narrow no longer allows, and removing a detached sandbox's entries.

// cutFlows deletes the sandbox's outbound flows that its policy no longer allows
// (only flows to only, when valid). Inbound flows and flows of unknown policy stay.
func (d *Datapath) cutFlows(s *sandbox, only netip.Addr) error {
	if !s.known {
		return nil
	}
	now := uint64(monoNow())
	var (
		k    airlockFlowKey
		v    airlockFlowVal
		dead []airlockFlowKey
	)
	it := d.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		if k.Idx != s.idx || v.Flags&flowInbound != 0 {
			continue
		}
		dst := netip.AddrFrom16(k.Raddr).Unmap()
		if only.IsValid() && dst != only {
			continue
		}
		if flowDenied(s, &k, now) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list flows: %w", err)
	}
	return d.deleteFlows(dead)
}

// flowDenied reports whether s's policy (with its live learned grants) no longer
// allows the outbound flow k.
func flowDenied(s *sandbox, k *airlockFlowKey, now uint64) bool {
	dst := netip.AddrFrom16(k.Raddr).Unmap()
	var lv airlockLearnedVal
	learned := s.learned.Lookup(&k.Raddr, &lv) == nil &&
		datapath.GrantsAllow(liveGrants(&lv, now), datapath.Proto(k.Proto), k.Rport, false)
	return !s.policy.Report && !datapath.Allows(s.policy, dst, datapath.Proto(k.Proto), k.Rport, learned)
}

// cutFlowsMany is cutFlows for several sandboxes in one pass over the flow table.
func (d *Datapath) cutFlowsMany(ss []*sandbox) error {
	byIdx := make(map[uint32]*sandbox, len(ss))
	for _, s := range ss {
		if s.known {
			byIdx[s.idx] = s
		}
	}
	now := uint64(monoNow())
	var (
		k    airlockFlowKey
		v    airlockFlowVal
		dead []airlockFlowKey
	)
	it := d.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		s := byIdx[k.Idx]
		if s == nil || v.Flags&flowInbound != 0 {
			continue
		}
		if flowDenied(s, &k, now) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list flows: %w", err)
	}
	return d.deleteFlows(dead)
}

// deleteFlows removes flows from the table (already gone is fine).
func (d *Datapath) deleteFlows(dead []airlockFlowKey) error {
	for _, k := range dead {
		if err := d.objs.Flows.Delete(&k); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			return fmt.Errorf("cut flow: %w", err)
		}
	}
	return nil
}

// deleteByIdx deletes every entry of a flow-keyed map that belongs to sandbox idx.
func (d *Datapath) deleteByIdx(m *bpf.Map, idx uint32, val any) error {
	var (
		k    airlockFlowKey
		dead []airlockFlowKey
	)
	it := m.Iterate()
	for it.Next(&k, val) {
		if k.Idx == idx {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range dead {
		if err := m.Delete(&k); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}
