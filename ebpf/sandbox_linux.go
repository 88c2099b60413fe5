package ebpf

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"

	bpf "github.com/cilium/ebpf"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Flag bits of sbx_cfg.flags (airlock.c).
const (
	cfgV6Block     = 1
	cfgDefaultAllw = 2
	cfgL7          = 4
	cfgReport      = 8
	cfgCountFlows  = 16
)

const (
	flowInbound = 1
	maxSbx      = 4096
)

// Attach implements datapath.Datapath.
func (d *Datapath) Attach(spec datapath.Spec) error {
	spec, err := datapath.ValidateSpec(spec)
	if err != nil {
		return err
	}
	d.sbx.Lock()
	defer d.sbx.Unlock()
	s, ok, err := d.sbx.Claim(spec, func(s *sandbox) bool { return s.ifindex == spec.HostIfindex }, d.detach)
	if err != nil {
		return err
	}
	if ok {
		return d.reattach(s, spec)
	}
	return d.attachNew(spec)
}

func (d *Datapath) attachNew(spec datapath.Spec) (err error) {
	idx, sl, err := d.takeSlot()
	if err != nil {
		return err
	}
	s := &sandbox{id: spec.ID, idx: idx, gen: randGen(), ifindex: spec.HostIfindex, ifname: spec.HostIfname, slot: sl, learned: sl.learned}
	defer func() {
		if err != nil {
			d.detach(s)
		}
	}()
	// The slot's maps are empty and no program reads them before the config below.
	n, err := fillRules(sl.rules4, sl.rules6, spec.Policy)
	if err != nil {
		return err
	}
	s.nRules = n
	if err := d.objs.SbxStats.Put(idx, make([]airlockSbxCounters, bpf.MustPossibleCPU())); err != nil {
		return fmt.Errorf("reset counters: %w", err)
	}
	meta := airlockSbxMeta{Ifindex: uint32(s.ifindex), Gen: s.gen}
	copy(meta.Id[:], s.id)
	// Config before hooks: the program never sees the veth without it.
	s.cfg = buildCfg(s, spec)
	if err := d.objs.CfgByIfindex.Put(uint32(s.ifindex), &s.cfg); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	if err := d.hook(s); err != nil {
		return err
	}
	d.hookSocket(s, spec.Cgroup)
	meta.AttachMode = uint32(s.mode)
	meta.CgroupId = s.cgroupID
	if err := d.objs.MetaByIdx.Put(idx, &meta); err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	s.policy, s.known = spec.Policy, true
	d.sbx.Add(s.id, s)
	d.byIdx[idx] = s
	d.idCache.Store(cacheKey(s.idx, s.gen), s.id)
	return nil
}

// reattach updates an attached (possibly adopted) sandbox in place.
func (d *Datapath) reattach(s *sandbox, spec datapath.Spec) error {
	s.ifname = spec.HostIfname
	if err := d.installRules(s, spec.Policy); err != nil {
		return err
	}
	s.cfg = buildCfg(s, spec)
	if err := d.objs.CfgByIfindex.Put(uint32(s.ifindex), &s.cfg); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	s.policy, s.known = spec.Policy, true
	if len(s.links) == 0 && s.mode != AttachTC {
		if err := d.rehook(s); err != nil {
			return err
		}
	}
	if s.cgroupID == 0 && spec.Cgroup != "" {
		d.hookSocket(s, spec.Cgroup)
		var meta airlockSbxMeta
		if d.objs.MetaByIdx.Lookup(s.idx, &meta) == nil {
			meta.CgroupId = s.cgroupID
			if err := d.objs.MetaByIdx.Put(s.idx, &meta); err != nil {
				return fmt.Errorf("write meta: %w", err)
			}
		}
	}
	return d.cutFlows(s, netip.Addr{})
}

// hookSocket adds the socket layer when the sandbox has a cgroup. It is the polite
// refusal, not the enforcement of record (the veth hooks are): a failure is logged
// and the sandbox stays enforced without it.
func (d *Datapath) hookSocket(s *sandbox, cgroup string) {
	if cgroup == "" {
		return
	}
	if err := d.hookCgroup(s, cgroup); err != nil {
		d.log.Warn("socket layer not attached; denied connections are dropped, not refused", "sandbox_id", s.id, "err", err)
	}
}

func buildCfg(s *sandbox, spec datapath.Spec) airlockSbxCfg {
	c := airlockSbxCfg{Idx: s.idx, Gen: s.gen, Flags: policyFlags(spec.Policy)}
	var n4, n6 int
	for _, a := range spec.Addrs {
		if a.Is4() {
			c.Addr4[n4] = be32(a)
			n4++
		} else {
			c.Addr6[n6] = addr16(a)
			n6++
		}
	}
	for _, r := range spec.Resolvers {
		if r.Is4() {
			c.Resolver4 = be32(r)
		} else {
			c.Resolver6 = addr16(r)
		}
	}
	return c
}

func policyFlags(p datapath.Policy) uint32 {
	var f uint32
	if p.IPv6 == datapath.IPv6Block {
		f |= cfgV6Block
	}
	if p.Default == datapath.ActionAllow {
		f |= cfgDefaultAllw
	}
	if p.L7 {
		f |= cfgL7
	}
	if p.Report {
		f |= cfgReport
	}
	if p.CountFlows {
		f |= cfgCountFlows
	}
	return f
}

// Detach implements datapath.Datapath (datapath.AttachedSet.Detach).
func (d *Datapath) Detach(id string) error { return d.sbx.Detach(id, d.detach) }

// detach removes hooks first (no packet runs without config), then config, inner maps,
// counters, meta and the sandbox's flow and drop-suppression entries. The sandbox
// leaves the attached set whatever failed: its slot is released and its learned map
// closed, so there is nothing left to retry.
func (d *Datapath) detach(s *sandbox) error {
	var errs []error
	if err := d.unhookCgroup(s); err != nil {
		errs = append(errs, err)
	}
	if err := d.unhook(s); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.linkDir(s)); err != nil {
		errs = append(errs, err)
	}
	ignore := func(err error) error {
		if err == nil || errors.Is(err, bpf.ErrKeyNotExist) {
			return nil
		}
		return err
	}
	var cur airlockSbxCfg
	if d.objs.CfgByIfindex.Lookup(uint32(s.ifindex), &cur) == nil && cur.Idx == s.idx {
		errs = append(errs, ignore(d.objs.CfgByIfindex.Delete(uint32(s.ifindex))))
	}
	errs = append(errs, ignore(d.objs.MetaByIdx.Delete(s.idx)))
	if s.slot != nil {
		errs = append(errs, d.releaseSlot(s.idx, s.slot))
		s.slot = nil
	} else {
		errs = append(errs, d.dropSlot(s.idx))
		if s.learned != nil {
			s.learned.Close()
		}
	}
	s.learned = nil
	errs = append(errs, d.deleteByIdx(d.objs.Flows, s.idx, new(airlockFlowVal)), d.deleteByIdx(d.objs.DropSeen, s.idx, new(airlockDropVal)))
	d.sbx.Remove(s.id)
	delete(d.byIdx, s.idx)
	d.idCache.Delete(cacheKey(s.idx, s.gen))
	return errors.Join(errs...)
}

// freeIdx returns the lowest index that is neither used, warm nor being warmed.
func (d *Datapath) freeIdx() (uint32, bool) {
	for i := uint32(0); i < maxSbx; i++ {
		_, used := d.byIdx[i]
		_, warm := d.warm[i]
		if !used && !warm && !d.warming[i] {
			return i, true
		}
	}
	return 0, false
}

func randGen() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	g := binary.NativeEndian.Uint32(b[:])
	if g == 0 {
		g = 1
	}
	return g
}
