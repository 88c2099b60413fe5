// Package nftfilter is Airlock's nftables egress datapath: the semantics of package
// egressd/datapath in an `inet airlock` table, one ingress base chain per sandbox hooked
// on its host-side veth, per-sandbox sets (source and resolver addresses, learned
// addresses with element timeouts, flows with idle timeouts) and named counters, all
// programmed over netlink with github.com/google/nftables (nft is never executed).
// It also owns the L7 redirect chain both backends use. README.md has the layout.
package nftfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// TableName is the default name of the tables (inet and netdev) holding everything
// this package creates.
const TableName = "airlock"

// ValidTableName reports whether name can name the tables: 1 to 64 ASCII letters,
// digits, '_' or '-', starting with a letter (an nft identifier an operator can type).
func ValidTableName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i, c := range name {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '_' || c == '-')) {
			return false
		}
	}
	return true
}

// CheckTableName returns nil when name ("" meaning TableName) can name the tables,
// else an error wrapping datapath.ErrInvalidSpec that says what a name may hold.
func CheckTableName(name string) error {
	if ValidTableName(tableName(name)) {
		return nil
	}
	return fmt.Errorf("%w: nftables table name %q (1-64 letters, digits, '_' or '-', starting with a letter)", datapath.ErrInvalidSpec, name)
}

// tableName is name, or TableName when name is empty.
func tableName(name string) string {
	if name == "" {
		return TableName
	}
	return name
}

// Config configures the nftables datapath. The zero value is usable.
type Config struct {
	// NetNS is the path of the network namespace holding the veths; empty means the
	// caller's.
	NetNS string
	// Table names the inet and netdev tables this filter owns; default TableName. Two
	// egressd instances in one network namespace need different tables: each adopts
	// and detaches every sandbox chain in its own.
	Table string
	// FlowIdle is how long a flow lives without packets; default 1h.
	FlowIdle time.Duration
	// L7Mark and L7MarkMask are the mark given to TCP 80/443 of L7 sandboxes; default
	// 0x1a170000/0xffff0000 (the same as the eBPF backend).
	L7Mark, L7MarkMask uint32
	// LogGroup is the NFLOG group events are sent to; 0 disables events.
	LogGroup uint16
	// EventBuffer is the capacity of the Events channel; default 4096.
	EventBuffer int
	Logger      *slog.Logger
}

func (c *Config) defaults() {
	c.Table = tableName(c.Table)
	if c.FlowIdle <= 0 {
		c.FlowIdle = time.Hour
	}
	if c.L7Mark == 0 {
		c.L7Mark, c.L7MarkMask = 0x1a170000, 0xffff0000
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Filter is the nftables implementation of datapath.Datapath.
type Filter struct {
	cfg   Config
	log   *slog.Logger
	conn  *nftables.Conn
	nsFd  *os.File
	table *nftables.Table
	// ndTable holds each sandbox's pre-chain (netdev family, see hostChain).
	ndTable *nftables.Table

	mu     sync.Mutex
	sbx    map[string]*sandbox
	closed bool

	events    chan datapath.Event
	lostLocal atomic.Uint64
	nflog     *nflogReader
}

type sandbox struct {
	id     string
	ifname string
	policy datapath.Policy
	known  bool
	// expiry mirrors the expiries of the learned grants written by this process, so
	// that a shorter ttl never shortens a live grant (re-adding an element resets its
	// timeout) and an address's live grants are counted.
	expiry map[netip.Addr]map[datapath.ProtoPorts]time.Time
}

// New connects to nftables (in cfg.NetNS), creates the airlock table if needed and
// adopts the sandbox chains already in it. Errors wrap datapath.ErrUnavailable when
// nftables cannot be used.
func New(cfg Config) (*Filter, error) {
	cfg.defaults()
	if err := CheckTableName(cfg.Table); err != nil {
		return nil, err
	}
	f := &Filter{cfg: cfg, log: cfg.Logger, sbx: map[string]*sandbox{}, events: make(chan datapath.Event, cfg.EventBuffer)}
	// A large socket send buffer lets UpdateMany send one transaction for many chains
	// (the default, about 200 KiB, holds the rules of a few sandboxes only).
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigSendBuffer)}
	if cfg.NetNS != "" {
		fd, err := os.Open(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("%w: netns: %v", datapath.ErrUnavailable, err)
		}
		f.nsFd = fd
		opts = append(opts, nftables.WithNetNSFd(int(fd.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		f.closeFd()
		return nil, fmt.Errorf("%w: netlink: %v", datapath.ErrUnavailable, err)
	}
	f.conn = conn
	f.table = &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}
	conn.AddTable(f.table)
	f.ndTable = &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyNetdev}
	conn.AddTable(f.ndTable)
	if err := conn.Flush(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: create table: %v", datapath.ErrUnavailable, err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != cfg.Table || !strings.HasPrefix(c.Name, "sbx_") {
			continue
		}
		id := strings.TrimPrefix(c.Name, "sbx_")
		s := &sandbox{id: id}
		// The hook device is not listed back: the first rule's user data carries it.
		if rules, err := conn.GetRules(f.table, c); err == nil && len(rules) > 0 {
			s.ifname = strings.TrimPrefix(string(rules[0].UserData), ifnameTag)
		}
		f.sbx[id] = s
		f.log.Info("adopted sandbox", "sandbox_id", id, "ifname", s.ifname)
	}
	if cfg.LogGroup != 0 {
		r, err := newNflogReader(cfg.NetNS, cfg.LogGroup, f.deliver)
		if err != nil {
			f.log.Warn("nflog events unavailable", "err", err)
		} else {
			f.nflog = r
		}
	}
	if f.nflog == nil {
		close(f.events)
	}
	return f, nil
}

// Backend implements datapath.Datapath.
func (f *Filter) Backend() datapath.Backend { return datapath.BackendNFTables }

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
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("%w: closed", datapath.ErrUnavailable)
	}
	for _, o := range f.sbx {
		if o.id != spec.ID && o.ifname == spec.HostIfname {
			return fmt.Errorf("%w: %s already belongs to sandbox %s", datapath.ErrInvalidSpec, spec.HostIfname, o.id)
		}
	}
	if s, ok := f.sbx[spec.ID]; ok && s.ifname != spec.HostIfname {
		if err := f.detach(s); err != nil {
			return err
		}
	}
	id := spec.ID
	chain := &nftables.Chain{
		Name: chainName(id), Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookRef(5), // NF_INET_INGRESS
		Priority: nftables.ChainPriorityRef(-500), Device: spec.HostIfname,
		Policy: ptr(nftables.ChainPolicyDrop),
	}
	s, existing := f.sbx[id]
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
		f.sbx[id] = s
	}
	s.ifname, s.policy, s.known = spec.HostIfname, spec.Policy, true
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

// Update implements datapath.Datapath: the chain is flushed and refilled in one
// transaction, so packets see the old or the new rules.
func (f *Filter) Update(id string, p datapath.Policy) error {
	p, err := datapath.ValidatePolicy(p)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sbx[id]
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
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
	f.mu.Lock()
	defer f.mu.Unlock()
	var items []item
	for _, u := range datapath.LatestUpdates(ups, errs) {
		i, p := u.Index, u.Policy
		s, ok := f.sbx[u.ID]
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

// Learn implements datapath.Datapath: set-element adds in one netlink transaction, to
// the learn set (every port) or the grant set (interval elements of daddr . l4proto .
// dport). Adding a live element again resets its timeout in the kernel, so a ttl that
// would end before the expiry this process last wrote is skipped (after an adoption,
// the first Learn of a grant sets its expiry).
func (f *Filter) Learn(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
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
	if ttl < time.Millisecond {
		ttl = time.Millisecond
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sbx[id]
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
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
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sbx[id]
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
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
	f.mu.Lock()
	s, ok := f.sbx[id]
	var err error
	if ok {
		err = f.unlearn(s, addr)
	}
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	if err != nil {
		return err
	}
	if err := f.Learn(id, addr, ports, ttl); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok = f.sbx[id]; !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	return f.cutFlows(s, addr)
}

// unlearn removes addr's learned and grant elements of s (flows stay). f.mu is held.
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

// cutFlows deletes the flows the sandbox's policy no longer allows (only those to
// only, when valid). Flows of inbound connections are kept.
func (f *Filter) cutFlows(s *sandbox, only netip.Addr) error {
	if !s.known || s.policy.Report {
		return nil
	}
	for _, fm := range []fam{v4, v6} {
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
			continue
		}
		if err := f.conn.SetDeleteElements(st, dead); err != nil {
			return err
		}
		if err := f.conn.Flush(); err != nil {
			return fmt.Errorf("cut flows: %w", err)
		}
	}
	return nil
}

// Detach implements datapath.Datapath: chain, sets and counters go in one transaction.
func (f *Filter) Detach(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sbx[id]
	if !ok {
		return fmt.Errorf("%w: %s", datapath.ErrUnknownSandbox, id)
	}
	return f.detach(s)
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
	delete(f.sbx, s.id)
	return nil
}

// Attached implements datapath.Datapath.
func (f *Filter) Attached() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.sbx))
	for id := range f.sbx {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Events implements datapath.Datapath. Without a LogGroup the channel is closed.
func (f *Filter) Events() <-chan datapath.Event { return f.events }

func (f *Filter) deliver(e datapath.Event) {
	select {
	case f.events <- e:
	default:
		f.lostLocal.Add(1)
	}
}

// Close implements datapath.Datapath; the table stays and keeps enforcing.
func (f *Filter) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	var errs []error
	if f.nflog != nil {
		errs = append(errs, f.nflog.Close())
		close(f.events)
	}
	if f.conn != nil {
		errs = append(errs, f.conn.CloseLasting())
	}
	f.closeFd()
	return errors.Join(errs...)
}

func (f *Filter) closeFd() {
	if f.nsFd != nil {
		f.nsFd.Close()
	}
}

// Stats implements datapath.Datapath.
func (f *Filter) Stats() (datapath.Stats, error) {
	st := datapath.Stats{Backend: datapath.BackendNFTables, Sandboxes: map[string]datapath.SandboxStats{}, EventsLost: f.lostLocal.Load()}
	if f.nflog != nil {
		st.EventsLost += f.nflog.lost.Load()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	objs, err := f.conn.GetObjects(f.table)
	if err != nil {
		return st, fmt.Errorf("list counters: %w", err)
	}
	counters := map[string]uint64{}
	for _, o := range objs {
		if c, ok := o.(*nftables.CounterObj); ok {
			counters[c.Name] = c.Packets
		}
	}
	for id, s := range f.sbx {
		ss := datapath.SandboxStats{Dropped: counters[dropCounter(id)], FlowsNew: counters[flowCounter(id)], Rules: len(s.policy.Rules)}
		for _, fm := range []fam{v4, v6} {
			if ls, err := f.conn.GetSetElements(f.set(learnSet(fm, id), addrType(fm))); err == nil {
				ss.Learned += len(ls)
			}
			if gs, _, err := f.grants(fm, id); err == nil {
				ss.Learned += len(gs)
			}
			flowType, _ := nftables.ConcatSetType(addrType(fm), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInetService)
			if fl, err := f.conn.GetSetElements(&nftables.Set{Table: f.table, Name: flowSet(fm, id), KeyType: flowType, Concatenation: true}); err == nil {
				ss.Flows += len(fl)
			}
		}
		st.Dropped += ss.Dropped
		st.FlowsNew += ss.FlowsNew
		st.Flows += ss.Flows
		st.Sandboxes[id] = ss
	}
	return st, nil
}

var _ datapath.Datapath = (*Filter)(nil)

// sendBufferBytes is the netlink socket's send buffer (SO_SNDBUFFORCE: egressd has
// CAP_NET_ADMIN); a failure leaves the default and UpdateMany falls back to one
// transaction per sandbox.
const sendBufferBytes = 64 << 20

func bigSendBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBufferBytes)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBufferBytes/4)
	})
	return nil
}
