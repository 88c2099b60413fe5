package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Attribution is process attribution without this datapath: the socket programs of
// airlock.c (cgroup connect4/6, sendmsg4/6 and sock_ops) loaded with the load-time
// constant record_only set, so that they record which process opened each flow in
// proc_by_flow and decide nothing. The nftables backend uses it
// (egressd/nftfilter.Config.Attribution) to name the process of its flows the way
// this datapath's events do. Nothing is pinned: the links and maps live as long as
// the Attribution (Close, or the process's end, removes every hook), as attribution
// is not enforcement and a restarted egressd watches its sandboxes again when it
// re-attaches them. It implements datapath.Attributor.
type Attribution struct {
	log  *slog.Logger
	objs attribObjects

	mu     sync.Mutex
	closed bool
	byID   map[string]*watched
	// free are released keys of cfg_by_ifindex; next is the next never used one.
	free []uint32
	next uint32
}

// attribObjects are the programs and maps of airlock.c an Attribution loads; the maps
// the programs reference beside these are created too (unpinned, shrunk: record_only
// never reaches them).
type attribObjects struct {
	Connect4        *bpf.Program `ebpf:"airlock_connect4"`
	Connect6        *bpf.Program `ebpf:"airlock_connect6"`
	Sendmsg4        *bpf.Program `ebpf:"airlock_sendmsg4"`
	Sendmsg6        *bpf.Program `ebpf:"airlock_sendmsg6"`
	Sockops         *bpf.Program `ebpf:"airlock_sockops"`
	ProcByFlow      *bpf.Map     `ebpf:"proc_by_flow"`
	IfindexByCgroup *bpf.Map     `ebpf:"ifindex_by_cgroup"`
	CfgByIfindex    *bpf.Map     `ebpf:"cfg_by_ifindex"`
}

func (o *attribObjects) close() error {
	return errors.Join(o.Connect4.Close(), o.Connect6.Close(), o.Sendmsg4.Close(), o.Sendmsg6.Close(),
		o.Sockops.Close(), o.ProcByFlow.Close(), o.IfindexByCgroup.Close(), o.CfgByIfindex.Close())
}

// watched is one watched sandbox: its key in cfg_by_ifindex (a number of this
// Attribution's, not an interface index: the programs only need the sandbox's
// addresses), its cgroup's id and the links.
type watched struct {
	key    uint32
	cgroup string
	cgID   uint64
	links  []link.Link
}

// OpenAttribution loads the socket programs recording only, for a datapath other than
// this one (egressd/enforcer hands the result to the nftables backend). It returns
// nil, nil when c.NoAttribution turns attribution off. Errors wrap
// datapath.ErrUnavailable when the kernel or the privileges do not allow cgroup eBPF
// programs here. c's pin root, attach mode and timeouts are not used.
func (c Config) OpenAttribution(log *slog.Logger) (datapath.Attributor, error) {
	if c.NoAttribution {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %v", datapath.ErrUnavailable, err)
	}
	spec, err := loadAirlock()
	if err != nil {
		return nil, fmt.Errorf("load spec: %w", err)
	}
	for name, v := range map[string]uint32{"attribute_procs": 1, "record_only": 1, "task_btf": map[bool]uint32{false: 1, true: 0}[c.TaskReads]} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	for name, m := range spec.Maps {
		m.Pinning = bpf.PinNone
		// Referenced by the verdict code record_only never runs: the smallest size.
		switch name {
		case "flows", "drop_seen", "meta_by_idx", "sbx_stats", "rules4_of", "rules6_of", "learned_of":
			m.MaxEntries = 1
		case "events":
			m.MaxEntries = uint32(unix.Getpagesize())
		}
	}
	a := &Attribution{log: log, byID: map[string]*watched{}}
	if err := loadAssign(spec, &a.objs, nil, log); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, bpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: %v", datapath.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("load attribution programs: %w", err)
	}
	return a, nil
}

// progs lists the programs and where each attaches.
func (a *Attribution) progs() []struct {
	prog *bpf.Program
	at   bpf.AttachType
} {
	return []struct {
		prog *bpf.Program
		at   bpf.AttachType
	}{
		{a.objs.Connect4, bpf.AttachCGroupInet4Connect},
		{a.objs.Connect6, bpf.AttachCGroupInet6Connect},
		{a.objs.Sendmsg4, bpf.AttachCGroupUDP4Sendmsg},
		{a.objs.Sendmsg6, bpf.AttachCGroupUDP6Sendmsg},
		{a.objs.Sockops, bpf.AttachCGroupSockOps},
	}
}

// Watch implements datapath.Attributor: the sandbox's addresses go to cfg_by_ifindex
// under a key of its own, its cgroup's id to ifindex_by_cgroup, and the five programs
// are attached to the cgroup (links, not pinned). Watching the same cgroup again only
// rewrites the addresses.
func (a *Attribution) Watch(spec datapath.Spec) (err error) {
	if spec.Cgroup == "" {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errors.New("attribution closed")
	}
	w := a.byID[spec.ID]
	if w != nil && w.cgroup != spec.Cgroup {
		a.unwatch(spec.ID, w)
		w = nil
	}
	if w != nil {
		cfg := attribCfg(w.key, spec.Addrs)
		return a.objs.CfgByIfindex.Put(w.key, &cfg)
	}
	id, err := cgroupID(spec.Cgroup)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", spec.Cgroup, err)
	}
	w = &watched{key: a.take(), cgroup: spec.Cgroup, cgID: id}
	defer func() {
		if err != nil {
			a.release(w)
		}
	}()
	cfg := attribCfg(w.key, spec.Addrs)
	if err := a.objs.CfgByIfindex.Put(w.key, &cfg); err != nil {
		return fmt.Errorf("map addresses: %w", err)
	}
	if err := a.objs.IfindexByCgroup.Put(id, w.key); err != nil {
		return fmt.Errorf("map cgroup: %w", err)
	}
	for _, p := range a.progs() {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: spec.Cgroup, Attach: p.at, Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", p.at, spec.Cgroup, err)
		}
		w.links = append(w.links, l)
	}
	a.byID[spec.ID] = w
	return nil
}

// Unwatch implements datapath.Attributor.
func (a *Attribution) Unwatch(id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if w := a.byID[id]; w != nil {
		return a.unwatch(id, w)
	}
	return nil
}

func (a *Attribution) unwatch(id string, w *watched) error {
	delete(a.byID, id)
	return a.release(w)
}

// release closes w's links (which detaches the programs), removes its map entries and
// frees its key.
func (a *Attribution) release(w *watched) error {
	var errs []error
	for _, l := range w.links {
		errs = append(errs, l.Close())
	}
	w.links = nil
	var cur uint32
	if w.cgID != 0 && a.objs.IfindexByCgroup.Lookup(w.cgID, &cur) == nil && cur == w.key {
		if err := a.objs.IfindexByCgroup.Delete(w.cgID); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := a.objs.CfgByIfindex.Delete(w.key); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	a.free = append(a.free, w.key)
	return errors.Join(errs...)
}

// take returns a free key of cfg_by_ifindex.
func (a *Attribution) take() uint32 {
	if n := len(a.free); n > 0 {
		k := a.free[n-1]
		a.free = a.free[:n-1]
		return k
	}
	a.next++
	return a.next
}

// attribCfg is the configuration the socket programs read in record_only mode: the
// sandbox's addresses (the local address of its UDP flows; destinations among them
// are local, not flows).
func attribCfg(key uint32, addrs []netip.Addr) airlockSbxCfg {
	c := airlockSbxCfg{Idx: key}
	var n4, n6 int
	for _, ad := range addrs {
		switch {
		case ad.Is4() && n4 < len(c.Addr4):
			c.Addr4[n4] = be32(ad)
			n4++
		case ad.Is6() && n6 < len(c.Addr6):
			c.Addr6[n6] = addr16(ad)
			n6++
		}
	}
	return c
}

// Process implements datapath.Attributor: e's 5-tuple's entry in proc_by_flow (for
// UDP, the connected socket's entry, local port 0, when the datagram's has none).
func (a *Attribution) Process(e datapath.Event) *datapath.Process {
	if e.Proto != datapath.ProtoTCP && e.Proto != datapath.ProtoUDP || !e.Src.IsValid() || !e.Dst.IsValid() {
		return nil
	}
	src, dst := e.Src.Addr(), e.Dst.Addr()
	k := airlockProcKey{Proto: uint8(e.Proto), Family: 4, Lport: e.Src.Port(), Rport: e.Dst.Port(),
		Laddr: src.Unmap().As16(), Raddr: dst.Unmap().As16()}
	if dst.Is6() && !dst.Is4In6() {
		k.Family = 6
	}
	var pi airlockProcInfo
	err := a.objs.ProcByFlow.Lookup(&k, &pi)
	if err != nil && e.Proto == datapath.ProtoUDP {
		k.Lport = 0
		err = a.objs.ProcByFlow.Lookup(&k, &pi)
	}
	if err != nil {
		return nil
	}
	return procOf(&pi)
}

// Close implements datapath.Attributor.
func (a *Attribution) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var errs []error
	for id, w := range a.byID {
		errs = append(errs, a.unwatch(id, w))
	}
	errs = append(errs, a.objs.close())
	return errors.Join(errs...)
}

var _ datapath.Attributor = (*Attribution)(nil)
