package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	bpf "github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Learned addresses: the sandbox's learned_of inner map, one entry per address holding
// up to datapath.MaxLearnedGrants grants, each with its own expiry, which the program
// checks against bpf_ktime_get_ns.

// Learn implements datapath.Datapath: one lookup and one update of the sandbox's
// learned map.
func (d *Datapath) Learn(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	addr, grants, err := datapath.ValidateLearn(addr, ports, ttl)
	if err != nil {
		return err
	}
	d.sbx.Lock()
	s, ok := d.sbx.Lookup(id)
	var m *bpf.Map
	if ok {
		m = s.learned
	}
	d.sbx.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	key := addr16(addr)
	now := uint64(monoNow())
	exp := now + uint64(ttl)
	// Read-modify-write of the address's grants; concurrent Learns of one sandbox
	// must not lose each other's grants.
	d.learnMu.Lock()
	defer d.learnMu.Unlock()
	var cur airlockLearnedVal
	if err := m.Lookup(&key, &cur); err != nil {
		cur = airlockLearnedVal{}
	}
	changed := false
	for _, g := range grants {
		lo, hi := g.Ports.Bounds()
		proto := uint8(g.Proto)
		slot, free := -1, -1
		for i := range cur.G {
			e := &cur.G[i]
			if e.ExpiresNs > now && e.Proto == proto && e.Lo == lo && e.Hi == hi {
				slot = i
				break
			}
			if free < 0 && e.ExpiresNs <= now {
				free = i
			}
		}
		switch {
		case slot >= 0:
			if cur.G[slot].ExpiresNs < exp {
				cur.G[slot].ExpiresNs, changed = exp, true
			}
		case free >= 0:
			cur.G[free].ExpiresNs, cur.G[free].Lo, cur.G[free].Hi, cur.G[free].Proto = exp, lo, hi, proto
			changed = true
		default:
			return fmt.Errorf("%w: sandbox %s: %s has %d live grants", datapath.ErrFull, id, addr, datapath.MaxLearnedGrants)
		}
	}
	if !changed {
		return nil
	}
	if err := m.Put(&key, &cur); err != nil {
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("%w: sandbox %s learned table", datapath.ErrFull, id)
		}
		return fmt.Errorf("learn %s: %w", addr, err)
	}
	return nil
}

// liveGrants lists the grants of a learned entry that have not expired at now.
func liveGrants(v *airlockLearnedVal, now uint64) []datapath.ProtoPorts {
	var out []datapath.ProtoPorts
	for _, g := range v.G {
		if g.ExpiresNs > now {
			out = append(out, datapath.ProtoPorts{Proto: datapath.Proto(g.Proto), Ports: datapath.PortRange{First: g.Lo, Last: g.Hi}})
		}
	}
	return out
}

// Forget implements datapath.Datapath.
func (d *Datapath) Forget(id string, addr netip.Addr) error {
	addr = addr.Unmap()
	d.sbx.Lock()
	defer d.sbx.Unlock()
	s, err := d.sbx.Get(id)
	if err != nil {
		return err
	}
	key := addr16(addr)
	if err := s.learned.Delete(&key); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
		return fmt.Errorf("forget %s: %w", addr, err)
	}
	return d.cutFlows(s, addr)
}

// Narrow implements datapath.Datapath: the address's learned entry is replaced (for
// the moment between, established flows still pass on the flow table), then the flows
// to it are checked against the new grants.
func (d *Datapath) Narrow(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	addr = addr.Unmap()
	d.sbx.Lock()
	s, ok := d.sbx.Lookup(id)
	d.sbx.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	key := addr16(addr)
	d.learnMu.Lock()
	err := s.learned.Delete(&key)
	d.learnMu.Unlock()
	if err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
		return fmt.Errorf("narrow %s: %w", addr, err)
	}
	if err := d.Learn(id, addr, ports, ttl); err != nil {
		return err
	}
	d.sbx.Lock()
	defer d.sbx.Unlock()
	if s, ok = d.sbx.Lookup(id); !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	return d.cutFlows(s, addr)
}
