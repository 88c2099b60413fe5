package ebpf

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	bpf "github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

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

// installRules builds fresh LPM inner maps for p and swaps them in (one update per
// family, atomic for the program).
func (d *Datapath) installRules(s *sandbox, p datapath.Policy) error {
	m4, m6, n, err := d.buildRules(p)
	if err != nil {
		return err
	}
	// Each install waits for an RCU grace period: in parallel they share one.
	var err6 error
	var wg sync.WaitGroup
	wg.Go(func() { err6 = d.objs.Rules6Of.Put(s.idx, m6) })
	err = d.objs.Rules4Of.Put(s.idx, m4)
	wg.Wait()
	if err = errors.Join(err, err6); err != nil {
		err = fmt.Errorf("install rules: %w", err)
	}
	if err != nil {
		m4.Close()
		m6.Close()
		return err
	}
	d.adoptRules(s, m4, m6, n)
	return nil
}

// buildRules creates and fills the LPM inner maps of p (not yet installed).
func (d *Datapath) buildRules(p datapath.Policy) (m4, m6 *bpf.Map, n int, err error) {
	if m4, err = bpf.NewMap(d.innerSpecs.rules4); err != nil {
		return nil, nil, 0, fmt.Errorf("create rules map: %w", err)
	}
	if m6, err = bpf.NewMap(d.innerSpecs.rules6); err != nil {
		m4.Close()
		return nil, nil, 0, fmt.Errorf("create rules map: %w", err)
	}
	if n, err = fillRules(m4, m6, p); err != nil {
		m4.Close()
		m6.Close()
		return nil, nil, 0, err
	}
	return m4, m6, n, nil
}

// adoptRules keeps m4 and m6, installed for s, in its slot (closing the replaced ones;
// an adopted sandbox has no slot: the outer map holds the only reference).
func (d *Datapath) adoptRules(s *sandbox, m4, m6 *bpf.Map, n int) {
	if s.slot == nil {
		m4.Close()
		m6.Close()
	} else {
		s.slot.rules4.Close()
		s.slot.rules6.Close()
		s.slot.rules4, s.slot.rules6 = m4, m6
	}
	s.nRules = n
}

// fillRules writes p's compiled prefixes into empty LPM maps and returns how many.
func fillRules(m4, m6 *bpf.Map, p datapath.Policy) (int, error) {
	table, err := datapath.CompilePrefixes(p.Rules)
	if err != nil {
		return 0, err
	}
	for _, pr := range table {
		var v airlockRuleVal
		v.N = uint32(len(pr.Rules))
		for i, r := range pr.Rules {
			lo, hi := r.Ports.Bounds()
			v.E[i].Lo, v.E[i].Hi, v.E[i].Proto, v.E[i].Id = lo, hi, uint8(r.Proto), r.ID
			switch r.Action {
			case datapath.ActionAllow:
				v.E[i].Action = 1 // ACT_ALLOW
			case datapath.ActionDenyAlways:
				v.E[i].Action = 3 // ACT_DENY_ALWAYS
			default:
				v.E[i].Action = 2 // ACT_DENY
			}
		}
		a := pr.Prefix.Addr()
		if a.Is4() {
			err = m4.Put(airlockLpm4Key{Prefixlen: uint32(pr.Prefix.Bits()), Addr: be32(a)}, &v)
		} else {
			err = m6.Put(airlockLpm6Key{Prefixlen: uint32(pr.Prefix.Bits()), Addr: a.As16()}, &v)
		}
		if err != nil {
			return 0, fmt.Errorf("write rule %s: %w", pr.Prefix, err)
		}
	}
	return len(table), nil
}

// Update implements datapath.Datapath.
func (d *Datapath) Update(id string, p datapath.Policy) error {
	p, err := datapath.ValidatePolicy(p)
	if err != nil {
		return err
	}
	d.sbx.Lock()
	defer d.sbx.Unlock()
	s, err := d.sbx.Get(id)
	if err != nil {
		return err
	}
	if err := d.installRules(s, p); err != nil {
		return err
	}
	return d.finishUpdate(s, p)
}

// UpdateMany implements datapath.BatchUpdater: Update for every element, with the new
// rule maps of all of them installed by one batch write per family. The kernel waits
// for an RCU grace period after each write to a map of maps (about 10-20 ms); one batch
// write waits once (Linux 6.8 and later; before, once per element, as Update), so an
// edit of a policy that a thousand sandboxes use costs one grace period, not a thousand.
// d.sbx's lock is held throughout.
func (d *Datapath) UpdateMany(ups []datapath.PolicyUpdate) []error {
	errs := make([]error, len(ups))
	type built struct {
		i      int
		s      *sandbox
		p      datapath.Policy
		m4, m6 *bpf.Map
		n      int
	}
	d.sbx.Lock()
	defer d.sbx.Unlock()
	var bs []built
	same := map[string]built{}
	for _, u := range datapath.LatestUpdates(ups, errs) {
		i, p := u.Index, u.Policy
		var err error
		s, ok := d.sbx.Lookup(u.ID)
		if !ok {
			errs[i] = fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, u.ID)
			continue
		}
		// Sandboxes under one policy have the same rules: one pair of maps, shared
		// (each slot holds its own handle).
		key, _ := json.Marshal(p.Rules)
		var m4, m6 *bpf.Map
		var n int
		if b, ok := same[string(key)]; ok {
			if m4, err = b.m4.Clone(); err == nil {
				if m6, err = b.m6.Clone(); err != nil {
					m4.Close()
				}
			}
			n = b.n
		} else if m4, m6, n, err = d.buildRules(p); err == nil {
			same[string(key)] = built{m4: m4, m6: m6, n: n}
		}
		if err != nil {
			errs[i] = err
			continue
		}
		bs = append(bs, built{i: i, s: s, p: p, m4: m4, m6: m6, n: n})
	}
	if len(bs) == 0 {
		return errs
	}
	keys := make([]uint32, len(bs))
	fds4 := make([]uint32, len(bs))
	fds6 := make([]uint32, len(bs))
	for j, b := range bs {
		keys[j], fds4[j], fds6[j] = b.s.idx, uint32(b.m4.FD()), uint32(b.m6.FD())
	}
	var err4, err6 error
	var wg sync.WaitGroup
	wg.Go(func() { _, err6 = d.objs.Rules6Of.BatchUpdate(keys, fds6, nil) })
	_, err4 = d.objs.Rules4Of.BatchUpdate(keys, fds4, nil)
	wg.Wait()
	if err := errors.Join(err4, err6); err != nil {
		// No batch writes for maps of maps here: one by one, as Update does.
		for _, b := range bs {
			b.m4.Close()
			b.m6.Close()
			if errs[b.i] = d.installRules(b.s, b.p); errs[b.i] == nil {
				errs[b.i] = d.finishUpdate(b.s, b.p)
			}
		}
		return errs
	}
	cut := make([]*sandbox, 0, len(bs))
	for _, b := range bs {
		d.adoptRules(b.s, b.m4, b.m6, b.n)
		if errs[b.i] = d.recordPolicy(b.s, b.p); errs[b.i] == nil {
			cut = append(cut, b.s)
		}
	}
	if err := d.cutFlowsMany(cut); err != nil {
		for _, b := range bs {
			if errs[b.i] == nil {
				errs[b.i] = err
			}
		}
	}
	return errs
}

// finishUpdate records p as s's policy after its rules are installed and cuts the
// established flows p denies.
func (d *Datapath) finishUpdate(s *sandbox, p datapath.Policy) error {
	if err := d.recordPolicy(s, p); err != nil {
		return err
	}
	return d.cutFlows(s, netip.Addr{})
}

// recordPolicy writes p's config flags for s and keeps p as its policy.
func (d *Datapath) recordPolicy(s *sandbox, p datapath.Policy) error {
	s.cfg.Flags = policyFlags(p)
	if err := d.objs.CfgByIfindex.Put(uint32(s.ifindex), &s.cfg); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	s.policy, s.known = p, true
	return nil
}

// Learn implements datapath.Datapath: one lookup and one update of the sandbox's
// learned map.
func (d *Datapath) Learn(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	addr = addr.Unmap()
	if !addr.IsValid() || ttl <= 0 {
		return fmt.Errorf("%w: learn %v ttl %v", datapath.ErrInvalidSpec, addr, ttl)
	}
	grants, err := datapath.ValidateGrants(ports)
	if err != nil {
		return err
	}
	if grants == nil {
		grants = []datapath.ProtoPorts{datapath.EveryPort}
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
