// Package enforcer builds the node's egress datapath: the eBPF backend when it loads
// and attaches, the nftables backend otherwise (or when configured), behind the one
// datapath.Datapath interface egressd uses. With the automatic choice a sandbox whose
// eBPF attach fails is attached with nftables instead; a sandbox is always enforced by
// exactly one backend (a failed eBPF attach leaves nothing behind).
//
// A backend chosen by configuration also manages the sandboxes the other backend still
// enforces from a previous run (the mode was switched): they stay with the other
// backend, which keeps receiving their policy changes, learned addresses and detach,
// until they are deleted; only new sandboxes go to the configured backend. Moving a
// running sandbox would cut its open connections (neither backend knows the flows the
// other saw), and leaving the other backend's filter in place unmanaged would keep
// enforcing a stale policy on top of the new one.
//
// In nftables mode the eBPF backend, when it has the optional OpenAttribution method
// (ebpf.Config), also loads its socket programs recording only, and the nftables
// backend names the process behind each event with them (nftfilter.Config.Attribution);
// when it cannot, events carry no process and the log says why once. In auto mode the
// nftables backend a sandbox falls back to does the same, loading the programs when
// the first sandbox falls back (lazyattrib.go).
//
// The package never imports the eBPF backend (ebpf/, which depends on egressd/datapath):
// the composition root hands it in as Config.EBPF (an ebpf.Config), so egressd depends
// only on the datapath contract.
package enforcer

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/egressd/nftfilter"
)

// Mode selects the backend.
type Mode string

const (
	ModeAuto     Mode = "auto"
	ModeEBPF     Mode = "ebpf"
	ModeNFTables Mode = "nftables"
)

// DefaultLogGroup is the NFLOG group the nftables backend of the default tables
// (nftfilter.TableName) reports events on unless Config.NFT.LogGroup says otherwise.
const DefaultLogGroup = 161

// LogGroupFor returns the default NFLOG group of the nftables tables named table:
// DefaultLogGroup for the default tables ("" or nftfilter.TableName), another one
// derived from the name (FNV-1a, in 1024..65534) for the others. One group has one
// listener on a host: two egressd with their own tables (two installations, the
// Kubernetes node beside airlock up, tests side by side) each receive their own events.
func LogGroupFor(table string) uint16 {
	if table == "" || table == nftfilter.TableName {
		return DefaultLogGroup
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	return uint16(1024 + h.Sum32()%(65535-1024))
}

// EBPF opens the eBPF backend. ebpf.Config implements it; the composition root
// (cmd/airlock, internal/up) passes one, so that this package and egressd never import
// ebpf/.
type EBPF interface {
	// Open loads the backend and adopts the sandboxes a previous run attached. netns,
	// when not empty, replaces the backend's own network namespace (the path of the
	// one holding the sandboxes' host-side veths); log is used when the backend has no
	// logger of its own. Errors wrap datapath.ErrUnavailable when the kernel or the
	// privileges do not allow eBPF here.
	Open(netns string, log *slog.Logger) (datapath.Datapath, error)
	// HasState reports whether a previous run left sandbox state that Open would
	// adopt. It reads the filesystem only, loads nothing.
	HasState() bool
	// RedirectMark returns the packet mark and mask the backend gives TCP 80/443 of
	// sandboxes in L7 mode: the nftables backend gives the same and the l7_redirect
	// chain matches it. A backend with the optional methods RedirectMarkOr and
	// OpenMarked (ebpf.Config) takes the mark of the tables instead (nftfilter.L7MarkFor:
	// each table name its own, so that another egressd's chain never catches this
	// one's sandboxes).
	RedirectMark() (mark, mask uint32)
}

// markChooser is an EBPF backend that gives TCP 80/443 of L7 sandboxes the mark of the
// enforcer's tables (nftfilter.L7MarkFor) unless it was configured with a mark of its
// own: ebpf.Config. Without it the backend's RedirectMark is the mark of both backends.
type markChooser interface {
	// RedirectMarkOr returns the backend's own mark and mask when it has one, else
	// mark and mask. It loads nothing.
	RedirectMarkOr(mark, mask uint32) (uint32, uint32)
	// OpenMarked is Open with RedirectMarkOr(mark, mask) as the mark.
	OpenMarked(netns string, mark, mask uint32, log *slog.Logger) (datapath.Datapath, error)
}

// attributionOpener is an EBPF backend that loads its socket programs recording only,
// for the nftables backend's process attribution: ebpf.Config.
type attributionOpener interface {
	// OpenAttribution returns the recording-only programs; nil, nil when
	// attribution is turned off. Errors wrap datapath.ErrUnavailable when the kernel
	// or the privileges do not allow cgroup eBPF programs.
	OpenAttribution(log *slog.Logger) (datapath.Attributor, error)
}

// Config configures the datapath.
type Config struct {
	// Mode is auto (default), ebpf or nftables.
	Mode Mode
	// NetNS is the network namespace of the veths ("" = the caller's); it overrides
	// the backends' own NetNS.
	NetNS string
	// EBPF is the eBPF backend (an ebpf.Config); nil means none: auto mode uses
	// nftables, ebpf mode fails with datapath.ErrUnavailable.
	EBPF EBPF
	NFT  nftfilter.Config
	// L7ProxyPort, when set, installs the l7_redirect chain sending marked TCP
	// (sandboxes in L7 mode, TCP 80/443) to this local port.
	L7ProxyPort uint16
	// L7ProxyAddr, when valid (IPv4), is the proxy's address the chain sends marked
	// IPv4 TCP to (DNAT); invalid: the address of the interface a packet arrived on
	// (nftfilter.L7Redirect.Addr).
	L7ProxyAddr netip.Addr
	Logger      *slog.Logger
}

// New returns the datapath for cfg. In auto mode an eBPF load failure falls back to
// nftables for every sandbox; an eBPF attach failure falls back for that sandbox. A
// sandbox on nftables, in either mode, has its processes recorded by the eBPF
// backend's socket programs loaded recording only (in auto mode loaded when the first
// sandbox falls back), unless they cannot load or attribution is off.
func New(cfg Config) (datapath.Datapath, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if cfg.NetNS != "" {
		cfg.NFT.NetNS = cfg.NetNS
	}
	// The tables' own L7 mark (nftfilter.L7MarkFor), which the eBPF backend takes too
	// unless it was configured with another one.
	mark, mask := nftfilter.L7MarkFor(cfg.NFT.Table)
	if mc, ok := cfg.EBPF.(markChooser); ok {
		mark, mask = mc.RedirectMarkOr(mark, mask)
	} else if cfg.EBPF != nil {
		mark, mask = cfg.EBPF.RedirectMark()
	}
	openEBPF := func() (datapath.Datapath, error) {
		if cfg.EBPF == nil {
			return nil, fmt.Errorf("%w: no eBPF backend configured", datapath.ErrUnavailable)
		}
		if mc, ok := cfg.EBPF.(markChooser); ok {
			return mc.OpenMarked(cfg.NetNS, mark, mask, cfg.Logger.With("backend", "ebpf"))
		}
		return cfg.EBPF.Open(cfg.NetNS, cfg.Logger.With("backend", "ebpf"))
	}
	// Checked here, not only by nftfilter.New: in auto mode its error would only turn
	// the nftables fallback off.
	if err := nftfilter.CheckTableName(cfg.NFT.Table); err != nil {
		return nil, err
	}
	if cfg.NFT.LogGroup == 0 {
		cfg.NFT.LogGroup = LogGroupFor(cfg.NFT.Table)
	}
	if cfg.NFT.Logger == nil {
		cfg.NFT.Logger = cfg.Logger.With("backend", "nftables")
	}
	cfg.NFT.L7Mark, cfg.NFT.L7MarkMask = mark, mask
	if cfg.L7ProxyPort != 0 {
		if err := nftfilter.EnsureL7Redirect(nftfilter.L7Redirect{NetNS: cfg.NetNS, Table: cfg.NFT.Table, Port: cfg.L7ProxyPort, Addr: cfg.L7ProxyAddr, Mark: mark, Mask: mask}); err != nil {
			return nil, err
		}
	}
	switch cfg.Mode {
	case ModeEBPF:
		bpf, err := openEBPF()
		if err != nil {
			return nil, err
		}
		return takeOver(bpf, cfg, func() (datapath.Datapath, error) {
			if has, err := nftfilter.HasSandboxes(cfg.NFT.NetNS, cfg.NFT.Table); !has {
				return nil, err
			}
			return nftfilter.New(cfg.NFT)
		})
	case ModeNFTables:
		if cfg.NFT.Attribution == nil {
			cfg.NFT.Attribution = openAttribution(cfg)
		}
		nft, err := nftfilter.New(cfg.NFT)
		if err != nil {
			return nil, err
		}
		return takeOver(nft, cfg, func() (datapath.Datapath, error) {
			if cfg.EBPF == nil || !cfg.EBPF.HasState() {
				return nil, nil
			}
			return openEBPF()
		})
	case ModeAuto:
	default:
		return nil, fmt.Errorf("%w: datapath mode %q (auto, ebpf, nftables)", datapath.ErrInvalidSpec, cfg.Mode)
	}
	if cfg.NFT.Attribution == nil {
		// A sandbox that falls back to nftables (all of them when eBPF does not load)
		// names its processes too, as in nftables mode.
		cfg.NFT.Attribution = &lazyAttribution{open: func() datapath.Attributor { return openAttribution(cfg) }}
	}
	nft, err := nftfilter.New(cfg.NFT)
	if err != nil {
		nft = nil
		cfg.Logger.Warn("nftables backend unavailable", "err", err)
	}
	bpf, err := openEBPF()
	if err != nil {
		if nft == nil {
			return nil, fmt.Errorf("no datapath backend: %w", err)
		}
		cfg.Logger.Warn("ebpf unavailable, using nftables", "err", err)
		return nft, nil
	}
	if nft == nil {
		return bpf, nil
	}
	return newFallback(bpf, nft, true, cfg.Logger), nil
}

// openAttribution loads the eBPF backend's socket programs recording only, so that the
// nftables backend's flows name their process as eBPF's do; nil, logged once, when the
// backend has none, attribution is off, or the kernel or privileges refuse (the flows
// then carry no process).
func openAttribution(cfg Config) datapath.Attributor {
	const off = "process attribution off on the nftables datapath: flows name no process"
	o, ok := cfg.EBPF.(attributionOpener)
	if !ok {
		cfg.Logger.Info(off, "reason", "no eBPF backend configured")
		return nil
	}
	a, err := o.OpenAttribution(cfg.Logger.With("backend", "nftables", "part", "attribution"))
	switch {
	case err != nil:
		cfg.Logger.Warn(off, "reason", "cgroup eBPF programs unavailable", "err", err)
		return nil
	case a == nil:
		cfg.Logger.Info(off, "reason", "attribution disabled by configuration")
		return nil
	}
	return a
}

// takeOver returns dp, the configured backend, managing as well the sandboxes the other
// backend (opened by other when it holds state from a previous run) still enforces.
func takeOver(dp datapath.Datapath, cfg Config, other func() (datapath.Datapath, error)) (datapath.Datapath, error) {
	old, err := other()
	if err != nil {
		// The other backend's state stays as it is; its sandboxes keep their last policy.
		cfg.Logger.Warn("state of the other datapath backend could not be opened; its sandboxes stay as they are", "err", err)
		return dp, nil
	}
	if old == nil {
		return dp, nil
	}
	if len(old.Attached()) == 0 {
		old.Close()
		return dp, nil
	}
	cfg.Logger.Info("sandboxes enforced by the other backend stay with it until deleted; new ones use the configured backend",
		"other", old.Backend(), "configured", dp.Backend(), "sandboxes", len(old.Attached()))
	return newFallback(dp, old, false, cfg.Logger), nil
}

// fallback routes each sandbox to the backend that enforces it. A new sandbox goes to
// the primary; with auto (primary eBPF, secondary nftables) to the secondary when the
// primary's attach fails for a reason other than a bad spec. Without auto the secondary
// only holds the sandboxes a previous run attached with it.
type fallback struct {
	primary, secondary datapath.Datapath
	auto               bool
	log                *slog.Logger

	// owner is the attached set: the backend that enforces each sandbox.
	owner datapath.AttachedSet[datapath.Datapath]

	events chan datapath.Event
	wg     sync.WaitGroup
}

func newFallback(primary, secondary datapath.Datapath, auto bool, log *slog.Logger) *fallback {
	f := &fallback{primary: primary, secondary: secondary, auto: auto, log: log, events: make(chan datapath.Event, 4096)}
	for _, id := range secondary.Attached() {
		f.owner.Add(id, secondary)
	}
	for _, id := range primary.Attached() {
		f.owner.Add(id, primary)
	}
	for _, b := range []datapath.Datapath{primary, secondary} {
		f.wg.Go(func() {
			for ev := range b.Events() {
				f.events <- ev
			}
		})
	}
	go func() { f.wg.Wait(); close(f.events) }()
	return f
}

func (f *fallback) Backend() datapath.Backend { return f.primary.Backend() }

func (f *fallback) Attach(spec datapath.Spec) error {
	f.owner.Lock()
	defer f.owner.Unlock()
	if b, ok := f.owner.Lookup(spec.ID); ok {
		return b.Attach(spec)
	}
	err := f.primary.Attach(spec)
	if err == nil {
		f.owner.Add(spec.ID, f.primary)
		return nil
	}
	if !f.auto || errors.Is(err, datapath.ErrInvalidSpec) {
		return err
	}
	f.log.Warn("ebpf attach failed, using nftables for this sandbox", "sandbox_id", spec.ID, "err", err)
	if err2 := f.secondary.Attach(spec); err2 != nil {
		return errors.Join(err, err2)
	}
	f.owner.Add(spec.ID, f.secondary)
	return nil
}

func (f *fallback) get(id string) (datapath.Datapath, error) {
	f.owner.Lock()
	defer f.owner.Unlock()
	return f.owner.Get(id)
}

// FlowCount implements datapath.FlowCounter for the sandboxes of a backend that
// counts denied flows in the kernel.
func (f *fallback) FlowCount(e datapath.Event) (datapath.FlowCount, bool) {
	b, err := f.get(e.Sandbox)
	if c, ok := b.(datapath.FlowCounter); err == nil && ok {
		return c.FlowCount(e)
	}
	return datapath.FlowCount{}, false
}

// FlowWindow implements datapath.FlowCounter: the primary's window.
func (f *fallback) FlowWindow() time.Duration {
	if c, ok := f.primary.(datapath.FlowCounter); ok {
		return c.FlowWindow()
	}
	return datapath.DefaultFlowWindow
}

func (f *fallback) Update(id string, p datapath.Policy) error {
	b, err := f.get(id)
	if err != nil {
		return err
	}
	return b.Update(id, p)
}

func (f *fallback) Learn(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	b, err := f.get(id)
	if err != nil {
		return err
	}
	return b.Learn(id, addr, ports, ttl)
}

func (f *fallback) Narrow(id string, addr netip.Addr, ports []datapath.ProtoPorts, ttl time.Duration) error {
	b, err := f.get(id)
	if err != nil {
		return err
	}
	return b.Narrow(id, addr, ports, ttl)
}

func (f *fallback) Forget(id string, addr netip.Addr) error {
	b, err := f.get(id)
	if err != nil {
		return err
	}
	return b.Forget(id, addr)
}

// Detach detaches id from the backend that enforces it. Unlike a backend's Detach
// (datapath.AttachedSet.Detach) the set's lock is not held meanwhile: the backend
// serialises its own work, and routing the other sandboxes' calls (Learn on the DNS
// answer path) need not wait for it.
func (f *fallback) Detach(id string) error {
	b, err := f.get(id)
	if err != nil {
		return err
	}
	if err := b.Detach(id); err != nil {
		return err
	}
	f.owner.Lock()
	f.owner.Remove(id)
	f.owner.Unlock()
	return nil
}

func (f *fallback) Attached() []string { return f.owner.Attached() }

func (f *fallback) Events() <-chan datapath.Event { return f.events }

func (f *fallback) Stats() (datapath.Stats, error) {
	a, err := f.primary.Stats()
	if err != nil {
		return a, err
	}
	b, err := f.secondary.Stats()
	if err != nil {
		return a, err
	}
	a.Passed += b.Passed
	a.Dropped += b.Dropped
	a.FlowsNew += b.FlowsNew
	a.Flows += b.Flows
	a.EventsLost += b.EventsLost
	for id, s := range b.Sandboxes {
		a.Sandboxes[id] = s
	}
	return a, nil
}

func (f *fallback) Close() error {
	return errors.Join(f.primary.Close(), f.secondary.Close())
}

var _ datapath.Datapath = (*fallback)(nil)
