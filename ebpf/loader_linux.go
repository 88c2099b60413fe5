package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Datapath is the eBPF implementation of datapath.Datapath. One value owns the loaded
// programs, the pinned maps and the links; Close releases them but leaves enforcement
// pinned.
type Datapath struct {
	cfg  Config
	log  *slog.Logger
	objs airlockObjects
	ns   netnsRef

	// sbx is the attached set (by id); its lock also guards byIdx, the slots and the
	// writes to the maps that are not per-entry atomic.
	sbx datapath.AttachedSet[*sandbox]
	// learnMu serialises Learn's read-modify-write of learned grants.
	learnMu sync.Mutex
	byIdx   map[uint32]*sandbox
	// warm are free indexes whose inner maps are installed and empty, warming those
	// the warmer is building (slots_linux.go).
	warm     map[uint32]*slot
	warming  map[uint32]bool
	warmKick chan struct{}
	warmDone chan struct{}

	innerSpecs struct{ rules4, rules6, learned *bpf.MapSpec }

	events     chan datapath.Event
	rd         *ringbuf.Reader
	lostLocal  atomic.Uint64
	readerDone chan struct{}
	// idCache maps sandbox index+gen to id for the event reader without taking mu.
	idCache sync.Map // uint64(idx<<32|gen) -> string
}

// sandbox is one attached sandbox as this process knows it.
type sandbox struct {
	id      string
	idx     uint32
	gen     uint32
	ifindex int
	ifname  string
	mode    AttachMode
	cfg     airlockSbxCfg
	policy  datapath.Policy
	known   bool // policy known (false for adopted sandboxes until Attach/Update)
	learned *bpf.Map
	// slot holds the index's inner maps (learned is slot.learned); nil for adopted
	// sandboxes, whose maps are removed at detach.
	slot   *slot
	links  []link.Link // TCX: ingress, egress
	nRules int
	// cgroupID and sockLinks are the socket layer (socket_linux.go); 0 and nil when
	// the sandbox has no cgroup.
	cgroupID  uint64
	sockLinks []link.Link
}

// New loads the programs, creates or reuses the pinned maps under cfg.PinRoot and
// adopts every sandbox attached by a previous process: their links are switched to
// the newly loaded programs in place (no gap, no second hook). Errors wrap
// datapath.ErrUnavailable when the kernel or privileges do not allow eBPF here.
func New(cfg Config) (*Datapath, error) {
	cfg.defaults()
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %v", datapath.ErrUnavailable, err)
	}
	for _, sub := range []string{"maps", "learned"} {
		if err := os.MkdirAll(filepath.Join(cfg.PinRoot, sub), 0o700); err != nil {
			return nil, fmt.Errorf("%w: pin root: %v", datapath.ErrUnavailable, err)
		}
	}
	spec, err := loadAirlock()
	if err != nil {
		return nil, fmt.Errorf("load spec: %w", err)
	}
	consts := map[string]any{
		"tcp_idle_ns":     uint64(cfg.TCPIdle),
		"udp_idle_ns":     uint64(cfg.UDPIdle),
		"other_idle_ns":   uint64(cfg.OtherIdle),
		"l7_mark":         cfg.L7Mark,
		"l7_mark_mask":    cfg.L7MarkMask,
		"flow_window_ns":  uint64(cfg.FlowWindow),
		"attribute_procs": map[bool]uint32{false: 1, true: 0}[cfg.NoAttribution],
		"task_btf":        map[bool]uint32{false: 1, true: 0}[cfg.TaskReads],
	}
	for name, v := range consts {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	layout := layoutFingerprint(spec)
	if err := checkLayout(cfg.PinRoot, layout, cfg.Logger); err != nil {
		return nil, err
	}
	d := &Datapath{
		cfg:        cfg,
		log:        cfg.Logger,
		ns:         netnsRef{path: cfg.NetNS},
		byIdx:      map[uint32]*sandbox{},
		warm:       map[uint32]*slot{},
		warming:    map[uint32]bool{},
		warmKick:   make(chan struct{}, 1),
		warmDone:   make(chan struct{}),
		events:     make(chan datapath.Event, cfg.EventBuffer),
		readerDone: make(chan struct{}),
	}
	d.innerSpecs.rules4 = spec.Maps["rules4_of"].InnerMap
	d.innerSpecs.rules6 = spec.Maps["rules6_of"].InnerMap
	d.innerSpecs.learned = spec.Maps["learned_of"].InnerMap
	opts := &bpf.CollectionOptions{Maps: bpf.MapOptions{PinPath: filepath.Join(cfg.PinRoot, "maps")}}
	if err := loadAssign(spec, &d.objs, opts, cfg.Logger); err != nil {
		if errors.Is(err, bpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("pinned maps under %s are from an incompatible version (detach all sandboxes and remove the directory): %w", cfg.PinRoot, err)
		}
		if errors.Is(err, unix.EPERM) || errors.Is(err, bpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: %v", datapath.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("load programs: %w", err)
	}
	if err := d.pinPrograms(); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := d.adopt(); err != nil {
		d.closeHandles()
		return nil, fmt.Errorf("adopt pinned sandboxes: %w", err)
	}
	if err := pinLayout(cfg.PinRoot, layout); err != nil {
		d.closeHandles()
		return nil, err
	}
	rd, err := ringbuf.NewReader(d.objs.Events)
	if err != nil {
		d.closeHandles()
		return nil, fmt.Errorf("ring buffer: %w", err)
	}
	d.rd = rd
	go d.readEvents()
	go d.warmer()
	d.kickWarmer()
	return d, nil
}

// Backend implements datapath.Datapath.
func (d *Datapath) Backend() datapath.Backend { return datapath.BackendEBPF }

// pinPrograms replaces the programs pinned under progs/ by the ones just loaded.
func (d *Datapath) pinPrograms() error {
	dir := filepath.Join(d.cfg.PinRoot, "progs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	progs := map[string]*bpf.Program{"from_sbx": d.objs.AirlockFromSbx, "to_sbx": d.objs.AirlockToSbx}
	for _, p := range d.sockProgs() {
		progs[p.name] = p.prog
	}
	for name, p := range progs {
		path := filepath.Join(dir, name)
		_ = os.Remove(path)
		if err := p.Pin(path); err != nil {
			return fmt.Errorf("pin program %s: %w", name, err)
		}
	}
	return nil
}

// adopt rebuilds the registry from meta_by_idx and switches every adopted hook to the
// programs this process loaded.
func (d *Datapath) adopt() error {
	var (
		idx  uint32
		meta airlockSbxMeta
	)
	it := d.objs.MetaByIdx.Iterate()
	var adopted []*sandbox
	for it.Next(&idx, &meta) {
		s := &sandbox{
			id:      cString(meta.Id[:]),
			idx:     idx,
			gen:     meta.Gen,
			ifindex: int(meta.Ifindex),
			mode:    AttachMode(meta.AttachMode),
			// The id is kept so detach can remove the map entry.
			cgroupID: meta.CgroupId,
		}
		adopted = append(adopted, s)
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, s := range adopted {
		if err := d.objs.CfgByIfindex.Lookup(uint32(s.ifindex), &s.cfg); err != nil {
			d.log.Warn("adopted sandbox has no interface config", "sandbox_id", s.id, "ifindex", s.ifindex, "err", err)
		}
		var id uint32
		if err := d.objs.LearnedOf.Lookup(s.idx, &id); err == nil {
			s.learned = d.openLearned(s.idx, bpf.MapID(id))
		}
		if s.learned == nil {
			return fmt.Errorf("sandbox %s: learned map missing", s.id)
		}
		if err := d.rehook(s); err != nil {
			d.log.Warn("adopted sandbox hooks could not be refreshed", "sandbox_id", s.id, "err", err)
		}
		if err := d.rehookCgroup(s); err != nil {
			d.log.Warn("adopted sandbox socket hooks could not be refreshed", "sandbox_id", s.id, "err", err)
		}
		d.sbx.Add(s.id, s)
		d.byIdx[s.idx] = s
		d.idCache.Store(cacheKey(s.idx, s.gen), s.id)
		d.log.Info("adopted sandbox", "sandbox_id", s.id, "ifindex", s.ifindex, "attach", s.mode.String())
	}
	return nil
}

// Attached implements datapath.Datapath.
func (d *Datapath) Attached() []string { return d.sbx.Attached() }

// Events implements datapath.Datapath.
func (d *Datapath) Events() <-chan datapath.Event { return d.events }

// Close implements datapath.Datapath: it stops the event reader and closes every
// handle; pinned links and maps keep enforcing.
func (d *Datapath) Close() error {
	d.sbx.Lock()
	if !d.sbx.Close() {
		d.sbx.Unlock()
		return nil
	}
	close(d.warmKick)
	d.sbx.Unlock()
	<-d.warmDone
	var errs []error
	if d.rd != nil {
		errs = append(errs, d.rd.Close())
		<-d.readerDone
	}
	errs = append(errs, d.closeHandles())
	return errors.Join(errs...)
}

func (d *Datapath) closeHandles() error {
	d.sbx.Lock()
	defer d.sbx.Unlock()
	for _, s := range d.sbx.All() {
		for _, l := range append(s.links, s.sockLinks...) {
			l.Close()
		}
		s.links, s.sockLinks = nil, nil
		if s.slot != nil {
			s.slot.close()
		} else if s.learned != nil {
			s.learned.Close()
		}
	}
	for _, sl := range d.warm {
		sl.close()
	}
	clear(d.warm)
	return d.objs.Close()
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func cacheKey(idx, gen uint32) uint64 { return uint64(idx)<<32 | uint64(gen) }

// addr16 returns a's 16-byte form (IPv4-mapped for IPv4).
func addr16(a netip.Addr) [16]byte { return a.As16() }

// be32 returns an IPv4 address as the native-endian integer whose memory is the
// address in network order (how the program compares it).
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// monoNow returns CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monoNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

var _ datapath.Datapath = (*Datapath)(nil)

// loadAssign is spec.LoadAndAssign, once more with the task read field by field
// (task_btf 0, Config.TaskReads) when the verifier refuses the programs as they read it
// through its BTF pointer: a kernel that does not give cgroup socket programs
// bpf_get_current_task_btf. The refusal is logged; other errors are returned as they
// are.
func loadAssign(spec *bpf.CollectionSpec, to any, opts *bpf.CollectionOptions, log *slog.Logger) error {
	err := spec.LoadAndAssign(to, opts)
	var ve *bpf.VerifierError
	v, ok := spec.Variables["task_btf"]
	if err == nil || !errors.As(err, &ve) || !ok {
		return err
	}
	var on uint32
	if v.Get(&on) != nil || on == 0 {
		return err
	}
	if serr := v.Set(uint32(0)); serr != nil {
		return err
	}
	log.Info("the kernel refused the socket programs' reads through the task's BTF pointer: reading it field by field", "err", ve)
	return spec.LoadAndAssign(to, opts)
}
