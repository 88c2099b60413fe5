package nftfilter

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Attaching a sandbox: its sets, counters, base chain and netdev pre-chain, created,
// refilled in place or removed in one netlink transaction each.

func (f *Filter) set(name string, key nftables.SetDatatype) *nftables.Set {
	return &nftables.Set{Table: f.table, Name: name, KeyType: key}
}

// grantSetDef is the definition of the sandbox's port-restricted learned grants.
func (f *Filter) grantSetDef(fm fam, id string) *nftables.Set {
	t, _ := nftables.ConcatSetType(addrType(fm), nftables.TypeInetProto, nftables.TypeInetService)
	return &nftables.Set{Table: f.table, Name: grantSet(fm, id), KeyType: t, Concatenation: true,
		Interval: true, HasTimeout: true, Size: datapath.MaxLearnedPerSbx}
}

// sandboxSets returns the sandbox's sets with their definitions.
func (f *Filter) sandboxSets(id string) []*nftables.Set {
	var out []*nftables.Set
	for _, fm := range []fam{v4, v6} {
		addr := nftables.TypeIPAddr
		if fm == v6 {
			addr = nftables.TypeIP6Addr
		}
		flowType, _ := nftables.ConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInetService)
		out = append(out, f.grantSetDef(fm, id),
			&nftables.Set{Table: f.table, Name: srcSet(fm, id), KeyType: addr},
			&nftables.Set{Table: f.table, Name: resSet(fm, id), KeyType: addr},
			&nftables.Set{Table: f.table, Name: learnSet(fm, id), KeyType: addr, HasTimeout: true, Size: datapath.MaxLearnedPerSbx},
			&nftables.Set{Table: f.table, Name: flowSet(fm, id), KeyType: flowType, Concatenation: true, HasTimeout: true, Dynamic: true, Timeout: f.cfg.FlowIdle, Size: 65535},
			&nftables.Set{Table: f.table, Name: inSet(fm, id), KeyType: flowType, Concatenation: true, HasTimeout: true, Dynamic: true, Timeout: f.cfg.FlowIdle, Size: 65535},
		)
	}
	return out
}

func addrElems(addrs []netip.Addr, is4 bool) []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range addrs {
		if a.Is4() == is4 {
			out = append(out, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return out
}

// Attach implements datapath.Datapath: the chain, sets and counters are created in
// one netlink transaction (all or nothing).
func (f *Filter) Attach(spec datapath.Spec) error {
	spec, err := datapath.ValidateSpec(spec)
	if err != nil {
		return err
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	s, existing, err := f.sbx.Claim(spec, func(s *sandbox) bool { return s.ifname == spec.HostIfname }, f.detach)
	if err != nil {
		return err
	}
	id := spec.ID
	chain := &nftables.Chain{
		Name: chainName(id), Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookRef(5), // NF_INET_INGRESS
		Priority: nftables.ChainPriorityRef(-500), Device: spec.HostIfname,
		Policy: ptr(nftables.ChainPolicyDrop),
	}
	if existing {
		// In place: refill address sets and the chain in one transaction.
		for _, fm := range []fam{v4, v6} {
			for _, name := range []string{srcSet(fm, id), resSet(fm, id)} {
				st := f.set(name, addrType(fm))
				f.conn.FlushSet(st)
				elems := addrElems(spec.Addrs, fm == v4)
				if strings.HasPrefix(name, "res") {
					elems = addrElems(spec.Resolvers, fm == v4)
				}
				if len(elems) > 0 {
					if err := f.conn.SetAddElements(st, elems); err != nil {
						return err
					}
				}
			}
		}
		// Sets added by a later version (inbound flows) are created when missing.
		for _, st := range f.sandboxSets(id) {
			if strings.HasPrefix(st.Name, "in") {
				if err := f.conn.AddSet(st, nil); err != nil {
					return fmt.Errorf("set %s: %w", st.Name, err)
				}
			}
		}
		f.conn.FlushChain(chain)
	} else {
		for _, st := range f.sandboxSets(id) {
			var elems []nftables.SetElement
			switch {
			case strings.HasPrefix(st.Name, "src"):
				elems = addrElems(spec.Addrs, st.KeyType == nftables.TypeIPAddr)
			case strings.HasPrefix(st.Name, "res"):
				elems = addrElems(spec.Resolvers, st.KeyType == nftables.TypeIPAddr)
			}
			if err := f.conn.AddSet(st, elems); err != nil {
				return fmt.Errorf("set %s: %w", st.Name, err)
			}
		}
		f.conn.AddObj(&nftables.CounterObj{Table: f.table, Name: dropCounter(id)})
		f.conn.AddObj(&nftables.CounterObj{Table: f.table, Name: flowCounter(id)})
		f.conn.AddChain(chain)
	}
	f.addRules(chain, id, spec.HostIfname, spec.Policy)
	hc := f.hostChain(id, spec.HostIfname)
	f.conn.AddChain(hc)
	f.conn.FlushChain(hc)
	f.conn.AddRule(&nftables.Rule{Table: f.ndTable, Chain: hc, Exprs: asHostPacket()})
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("attach %s on %s: %w", id, spec.HostIfname, err)
	}
	if !existing {
		s = &sandbox{id: id}
		f.sbx.Add(id, s)
	}
	s.ifname, s.policy, s.known = spec.HostIfname, spec.Policy, true
	f.watch(spec)
	if existing {
		return f.cutFlows(s, netip.Addr{})
	}
	return nil
}

// hostChain is the sandbox's pre-chain: a netdev ingress chain on the host veth, before
// the inet chain, that marks the sandbox's packets as addressed to this host. They are
// addressed to the bridge's MAC, which is not the veth's, so the kernel marked them for
// another host, and icmp_send answers only packets for this host: without the mark a
// denied UDP datagram would get no ICMP administratively prohibited (the inet ingress
// hook cannot set the packet type). The bridge forwards by MAC, not by packet type.
// Without the pre-chain, denials stay silent drops (fail closed).
func (f *Filter) hostChain(id, ifname string) *nftables.Chain {
	return &nftables.Chain{
		Name: chainName(id), Table: f.ndTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityRef(-600),
		Device: ifname, Policy: ptr(nftables.ChainPolicyAccept),
	}
}

// ifnameTag prefixes the first rule's user data, which records the hook device.
const ifnameTag = "airlock-ifname="

func (f *Filter) addRules(chain *nftables.Chain, id, ifname string, p datapath.Policy) {
	for i, r := range f.chainRules(id, p) {
		rule := &nftables.Rule{Table: f.table, Chain: chain, Exprs: r}
		if i == 0 {
			rule.UserData = []byte(ifnameTag + ifname)
		}
		f.conn.AddRule(rule)
	}
}

func addrType(fm fam) nftables.SetDatatype {
	if fm == v4 {
		return nftables.TypeIPAddr
	}
	return nftables.TypeIP6Addr
}

func ptr[T any](v T) *T { return &v }

// Detach implements datapath.Datapath: chain, sets and counters go in one transaction
// (datapath.AttachedSet.Detach: a sandbox whose transaction fails stays attached).
func (f *Filter) Detach(id string) error { return f.sbx.Detach(id, f.detach) }

// watch has the sandbox's processes recorded (Config.Attribution); a failure is
// logged: the sandbox stays enforced, its events without a process.
func (f *Filter) watch(spec datapath.Spec) {
	if f.cfg.Attribution == nil {
		return
	}
	if err := f.cfg.Attribution.Watch(spec); err != nil {
		f.log.Warn("process attribution not attached; this sandbox's flows name no process", "sandbox_id", spec.ID, "err", err)
	}
}

func (f *Filter) detach(s *sandbox) error {
	// The pre-chain first, on its own: it may be gone with its device.
	f.conn.DelChain(&nftables.Chain{Name: chainName(s.id), Table: f.ndTable})
	_ = f.conn.Flush()
	f.conn.DelChain(&nftables.Chain{Name: chainName(s.id), Table: f.table})
	for _, st := range f.sandboxSets(s.id) {
		f.conn.DelSet(st)
	}
	f.conn.DeleteObject(&nftables.CounterObj{Table: f.table, Name: dropCounter(s.id)})
	f.conn.DeleteObject(&nftables.CounterObj{Table: f.table, Name: flowCounter(s.id)})
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("detach %s: %w", s.id, err)
	}
	if f.cfg.Attribution != nil {
		if err := f.cfg.Attribution.Unwatch(s.id); err != nil {
			f.log.Warn("process attribution not detached", "sandbox_id", s.id, "err", err)
		}
	}
	return nil
}

// Attached implements datapath.Datapath.
func (f *Filter) Attached() []string { return f.sbx.Attached() }
