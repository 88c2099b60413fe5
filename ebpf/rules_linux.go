package ebpf

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	bpf "github.com/cilium/ebpf"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Static rules: each sandbox's LPM inner maps (rules4_of, rules6_of), filled at Attach
// and replaced whole, atomically per family, by Update and UpdateMany.

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
			case datapath.ActionDenyAudit:
				v.E[i].Action = 4 // ACT_DENY_AUDIT
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
