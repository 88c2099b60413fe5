package nftfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/google/nftables"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Policy changes: the sandbox's chain flushed and refilled in one transaction, then
// the flows the new policy denies cut from its flow sets.

// Update implements datapath.Datapath: the chain is flushed and refilled in one
// transaction, so packets see the old or the new rules.
func (f *Filter) Update(id string, p datapath.Policy) error {
	p, err := datapath.ValidatePolicy(p)
	if err != nil {
		return err
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	s, err := f.sbx.Get(id)
	if err != nil {
		return err
	}
	f.refill(s, p)
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("update %s: %w", id, err)
	}
	s.policy, s.known = p, true
	return f.cutFlows(s, netip.Addr{})
}

// refill queues the flush and refill of s's chain for p (sent by the next Flush).
func (f *Filter) refill(s *sandbox, p datapath.Policy) {
	chain := &nftables.Chain{Name: chainName(s.id), Table: f.table}
	f.conn.FlushChain(chain)
	f.addRules(chain, s.id, s.ifname, p)
}

// UpdateMany implements datapath.BatchUpdater: every chain is flushed and refilled in
// one netlink transaction, which the kernel validates once (one by one, each update
// validates the whole table). When the transaction fails nothing of it applied, and
// the updates are retried one by one so that each gets its own error.
func (f *Filter) UpdateMany(ups []datapath.PolicyUpdate) []error {
	errs := make([]error, len(ups))
	type item struct {
		i int
		s *sandbox
		p datapath.Policy
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	var items []item
	for _, u := range datapath.LatestUpdates(ups, errs) {
		i, p := u.Index, u.Policy
		s, ok := f.sbx.Lookup(u.ID)
		if !ok {
			errs[i] = fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, u.ID)
			continue
		}
		f.refill(s, p)
		items = append(items, item{i, s, p})
	}
	if len(items) == 0 {
		return errs
	}
	if err := f.conn.Flush(); err != nil {
		for _, it := range items {
			f.refill(it.s, it.p)
			if err := f.conn.Flush(); err != nil {
				errs[it.i] = fmt.Errorf("update %s: %w", it.s.id, err)
				continue
			}
			it.s.policy, it.s.known = it.p, true
			errs[it.i] = f.cutFlows(it.s, netip.Addr{})
		}
		return errs
	}
	for _, it := range items {
		it.s.policy, it.s.known = it.p, true
		errs[it.i] = f.cutFlows(it.s, netip.Addr{})
	}
	return errs
}

// cutFlows deletes the flows the sandbox's policy no longer allows (only those to
// only, when valid). Flows of inbound connections are kept.
//
// A flow element can time out between listing and deleting; the kernel then refuses
// the whole delete batch with ENOENT, so the cut lists again and retries (at most
// cutAttempts times per family).
func (f *Filter) cutFlows(s *sandbox, only netip.Addr) error {
	if !s.known || s.policy.Report {
		return nil
	}
	for _, fm := range []fam{v4, v6} {
		var err error
		for range cutAttempts {
			if err = f.cutFamilyFlows(s, only, fm); !errors.Is(err, syscall.ENOENT) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cutAttempts bounds cutFlows' retries when flows expire while it cuts them.
const cutAttempts = 3

// cutFamilyFlows is cutFlows for one address family.
func (f *Filter) cutFamilyFlows(s *sandbox, only netip.Addr, fm fam) error {
	learned := map[netip.Addr]bool{}
	ls, err := f.conn.GetSetElements(f.set(learnSet(fm, s.id), addrType(fm)))
	if err != nil {
		return fmt.Errorf("list learned: %w", err)
	}
	for _, e := range ls {
		learned[fm.addrFromKey(e.Key)] = true
	}
	grants, _, err := f.grants(fm, s.id)
	if err != nil {
		return err
	}
	flowType, _ := nftables.ConcatSetType(addrType(fm), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInetService)
	st := &nftables.Set{Table: f.table, Name: flowSet(fm, s.id), KeyType: flowType, Concatenation: true}
	flows, err := f.conn.GetSetElements(st)
	if err != nil {
		return fmt.Errorf("list flows: %w", err)
	}
	var dead []nftables.SetElement
	al := int(fm.addrLen)
	for _, e := range flows {
		if len(e.Key) < al+12 {
			continue
		}
		dst := fm.addrFromKey(e.Key)
		proto := datapath.Proto(e.Key[al])
		port := uint16(e.Key[al+4])<<8 | uint16(e.Key[al+5])
		if only.IsValid() && dst != only {
			continue
		}
		granted := learned[dst] || datapath.GrantsAllow(grants[dst], proto, port, false)
		if !datapath.Allows(s.policy, dst, proto, port, granted) {
			dead = append(dead, nftables.SetElement{Key: e.Key})
		}
	}
	if len(dead) == 0 {
		return nil
	}
	if err := f.conn.SetDeleteElements(st, dead); err != nil {
		return err
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("cut flows: %w", err)
	}
	return nil
}
