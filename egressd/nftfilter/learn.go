package nftfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Learned addresses: elements of the learn sets (every port) and of the grant sets
// (port-restricted intervals), each with its own timeout.

// Learn implements datapath.Datapath: set-element adds in one netlink transaction, to
// the learn set (every port) or the grant set (interval elements of daddr . l4proto .
// dport). Adding a live element again resets its timeout in the kernel, so a ttl that
// would end before the expiry this process last wrote is skipped (after an adoption,
// the first Learn of a grant sets its expiry).
func (f *Filter) Learn(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	addr, grants, err := datapath.ValidateLearn(addr, ports, ttl)
	if err != nil {
		return err
	}
	if ttl < time.Millisecond {
		ttl = time.Millisecond
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	s, err := f.sbx.Get(id)
	if err != nil {
		return err
	}
	now := time.Now()
	if s.expiry == nil || len(s.expiry) > 2*datapath.MaxLearnedPerSbx {
		s.expiry = pruneExpired(s.expiry, now)
	}
	live := 0
	for _, exp := range s.expiry[addr] {
		if exp.After(now) {
			live++
		}
	}
	fm := v4
	if addr.Is6() {
		fm = v6
	}
	var every, restricted []nftables.SetElement
	var added []datapath.ProtoPorts
	for _, g := range grants {
		exp, known := s.expiry[addr][g]
		if known && exp.After(now.Add(ttl)) {
			continue
		}
		if !known || !exp.After(now) {
			if live++; live > datapath.MaxLearnedGrants {
				return fmt.Errorf("%w: sandbox %s: %s has %d live grants", datapath.ErrFull, id, addr, datapath.MaxLearnedGrants)
			}
		}
		added = append(added, g)
		if g == datapath.EveryPort {
			every = append(every, nftables.SetElement{Key: addr.AsSlice(), Timeout: ttl})
		} else {
			restricted = append(restricted, grantElem(addr, g, ttl))
		}
	}
	if len(added) == 0 {
		return nil
	}
	if len(every) > 0 {
		st := &nftables.Set{Table: f.table, Name: learnSet(fm, id), KeyType: addrType(fm), HasTimeout: true}
		if err := f.conn.SetAddElements(st, every); err != nil {
			return err
		}
	}
	if len(restricted) > 0 {
		if err := f.conn.SetAddElements(f.grantSetDef(fm, id), restricted); err != nil {
			return err
		}
	}
	if err := f.conn.Flush(); err != nil {
		if strings.Contains(err.Error(), "no space") {
			return fmt.Errorf("%w: sandbox %s learned set", datapath.ErrFull, id)
		}
		return fmt.Errorf("learn %s: %w", addr, err)
	}
	if s.expiry[addr] == nil {
		s.expiry[addr] = map[datapath.ProtoPorts]time.Time{}
	}
	for _, g := range added {
		s.expiry[addr][g] = now.Add(ttl)
	}
	return nil
}

func pruneExpired(m map[netip.Addr]map[datapath.ProtoPorts]time.Time, now time.Time) map[netip.Addr]map[datapath.ProtoPorts]time.Time {
	out := make(map[netip.Addr]map[datapath.ProtoPorts]time.Time, len(m))
	for a, gs := range m {
		for g, t := range gs {
			if t.After(now) {
				if out[a] == nil {
					out[a] = map[datapath.ProtoPorts]time.Time{}
				}
				out[a][g] = t
			}
		}
	}
	return out
}

// grants lists the sandbox's port-restricted learned grants of family fm by address.
func (f *Filter) grants(fm fam, id string) (map[netip.Addr][]datapath.ProtoPorts, []nftables.SetElement, error) {
	elems, err := f.conn.GetSetElements(f.grantSetDef(fm, id))
	if err != nil {
		return nil, nil, fmt.Errorf("list learned grants: %w", err)
	}
	out := map[netip.Addr][]datapath.ProtoPorts{}
	for _, e := range elems {
		if a, g, ok := grantFromElem(fm, e); ok {
			out[a] = append(out[a], g)
		}
	}
	return out, elems, nil
}

// Forget implements datapath.Datapath.
func (f *Filter) Forget(id string, addr netip.Addr) error {
	addr = addr.Unmap()
	f.sbx.Lock()
	defer f.sbx.Unlock()
	s, err := f.sbx.Get(id)
	if err != nil {
		return err
	}
	if err := f.unlearn(s, addr); err != nil {
		return err
	}
	return f.cutFlows(s, addr)
}

// Narrow implements datapath.Datapath: the address's learned elements are replaced
// (for the moment between, established flows still pass on the flow sets), then the
// flows to it are checked against the new grants.
func (f *Filter) Narrow(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	addr = addr.Unmap()
	f.sbx.Lock()
	s, ok := f.sbx.Lookup(id)
	var err error
	if ok {
		err = f.unlearn(s, addr)
	}
	f.sbx.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	if err != nil {
		return err
	}
	if err := f.Learn(id, addr, ports, ttl); err != nil {
		return err
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	if s, ok = f.sbx.Lookup(id); !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	return f.cutFlows(s, addr)
}

// unlearn removes addr's learned and grant elements of s (flows stay). f.sbx's lock is
// held.
func (f *Filter) unlearn(s *sandbox, addr netip.Addr) error {
	id := s.id
	fm := v4
	if addr.Is6() {
		fm = v6
	}
	delete(s.expiry, addr)
	_, gelems, err := f.grants(fm, id)
	if err != nil {
		return err
	}
	var gdel []nftables.SetElement
	for _, e := range gelems {
		if a, _, ok := grantFromElem(fm, e); ok && a == addr {
			gdel = append(gdel, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
		}
	}
	if len(gdel) > 0 {
		if err := f.conn.SetDeleteElements(f.grantSetDef(fm, id), gdel); err != nil {
			return err
		}
		if err := f.conn.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("forget %s: %w", addr, err)
		}
	}
	st := f.set(learnSet(fm, id), addrType(fm))
	elems, err := f.conn.GetSetElements(st)
	if err != nil {
		return fmt.Errorf("list learned: %w", err)
	}
	if slices.ContainsFunc(elems, func(e nftables.SetElement) bool { return fm.addrFromKey(e.Key) == addr }) {
		if err := f.conn.SetDeleteElements(st, []nftables.SetElement{{Key: addr.AsSlice()}}); err != nil {
			return err
		}
		if err := f.conn.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("forget %s: %w", addr, err)
		}
	}
	return nil
}
