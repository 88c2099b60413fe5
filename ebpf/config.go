package ebpf

import (
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// DefaultPinRoot is where programs, links and maps are pinned.
const DefaultPinRoot = "/sys/fs/bpf/airlock"

// AttachMode selects how programs are hooked to a veth.
type AttachMode uint32

const (
	// AttachAuto uses a clsact qdisc with direct-action cls_bpf filters: attaching a
	// TCX link waits for an RCU grace period (~12 ms per link on a 2-core machine,
	// two per sandbox), a cls_bpf filter does not (~0.2 ms), and Airlock owns the
	// host veths, so TCX's coexistence with other tc users buys nothing here.
	AttachAuto AttachMode = 0
	// AttachTCX uses TCX links only.
	AttachTCX AttachMode = 1
	// AttachTC uses a clsact qdisc with direct-action cls_bpf filters.
	AttachTC AttachMode = 2
)

// String returns "auto", "tcx" or "tc".
func (m AttachMode) String() string {
	switch m {
	case AttachTCX:
		return "tcx"
	case AttachTC:
		return "tc"
	}
	return "auto"
}

// Config configures the eBPF datapath. The zero value is usable.
type Config struct {
	// PinRoot is the bpffs directory for pinned state; default DefaultPinRoot. Tests
	// use a directory of their own.
	PinRoot string
	// NetNS is the path of the network namespace holding the sandboxes' host-side
	// veths (for example /var/run/netns/x); empty means the caller's.
	NetNS string
	// Attach selects TCX or clsact; default AttachAuto.
	Attach AttachMode
	// Idle timeouts of established flows; defaults 1h (TCP), 2m (UDP), 30s (other).
	TCPIdle, UDPIdle, OtherIdle time.Duration
	// L7Mark and L7MarkMask are the packet mark given to TCP 80/443 of sandboxes in
	// L7 mode (the redirect rule matches it); default: the mark of egressd's nftables
	// tables (nftfilter.L7MarkFor, through OpenMarked), datapath.DefaultL7Mark and
	// DefaultL7MarkMask when opened with Open.
	L7Mark, L7MarkMask uint32
	// FlowWindow groups packets into flows: a denied (or, with Policy.CountFlows,
	// allowed) packet of a 5-tuple whose last one is less than this old belongs to the
	// same flow and is only counted (FlowCounter); default 2s.
	FlowWindow time.Duration
	// NoAttribution turns process attribution off: the socket programs then do not
	// record which process opened a flow (no sock_ops program, no proc_by_flow
	// entries) and events carry no Process. Default on.
	NoAttribution bool
	// TaskReads makes the socket programs read the calling task (attribution) field by
	// field with bpf_probe_read_kernel instead of through its BTF pointer
	// (bpf_get_current_task_btf): what they fall back to, logged, on a kernel that
	// does not give cgroup socket programs that helper. Only for tests; it costs CPU.
	TaskReads bool
	// EventBuffer is the capacity of the Events channel; default 4096.
	EventBuffer int
	Logger      *slog.Logger
}

// Open implements enforcer.EBPF, the way egressd gets this backend from the
// composition root: New(c) with c.NetNS replaced by netns when that is not empty, and
// c.Logger defaulting to log. Errors as New.
func (c Config) Open(netns string, log *slog.Logger) (datapath.Datapath, error) {
	if netns != "" {
		c.NetNS = netns
	}
	if c.Logger == nil {
		c.Logger = log
	}
	d, err := New(c)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return d, nil
}

// PinPath is the bpffs directory of c's pinned state (PinRoot, default applied);
// egressd/enforcer locks it and removes it when no sandbox is left.
func (c Config) PinPath() string {
	c.defaults()
	return c.PinRoot
}

// PinnedSandboxes counts the sandboxes the state pinned under c's pin root enforces
// (entries of the pinned cfg_by_ifindex map); 0 when nothing is pinned, -1 when the
// pinned map cannot be read. It loads no program.
func (c Config) PinnedSandboxes() int {
	c.defaults()
	return pinnedSandboxes(c.PinRoot)
}

// RedirectMarkOr is the mark and mask c gives TCP 80/443 of sandboxes in L7 mode when
// egressd's tables mark with mark and mask: c's own L7Mark when set, else those.
// egressd/enforcer calls it (an optional method of enforcer.EBPF) so that both
// backends and the l7_redirect chain agree on the tables' mark.
func (c Config) RedirectMarkOr(mark, mask uint32) (uint32, uint32) {
	if c.L7Mark != 0 {
		return c.L7Mark, c.L7MarkMask
	}
	return mark, mask
}

// OpenMarked is Open with RedirectMarkOr(mark, mask) as the redirect mark.
func (c Config) OpenMarked(netns string, mark, mask uint32, log *slog.Logger) (datapath.Datapath, error) {
	c.L7Mark, c.L7MarkMask = c.RedirectMarkOr(mark, mask)
	return c.Open(netns, log)
}

// HasState implements enforcer.EBPF: whether c's pin root holds sandbox state pinned
// by a previous run (the meta_by_idx map), which New would adopt. It only stats a file.
func (c Config) HasState() bool {
	c.defaults()
	_, err := os.Stat(filepath.Join(c.PinRoot, "maps", "meta_by_idx"))
	return err == nil
}

// RedirectMark implements enforcer.EBPF: the mark and mask c gives TCP 80/443 of
// sandboxes in L7 mode (L7Mark, L7MarkMask, defaults applied).
func (c Config) RedirectMark() (mark, mask uint32) {
	c.defaults()
	return c.L7Mark, c.L7MarkMask
}

func (c *Config) defaults() {
	if c.PinRoot == "" {
		c.PinRoot = DefaultPinRoot
	}
	if c.TCPIdle <= 0 {
		c.TCPIdle = time.Hour
	}
	if c.UDPIdle <= 0 {
		c.UDPIdle = 2 * time.Minute
	}
	if c.OtherIdle <= 0 {
		c.OtherIdle = 30 * time.Second
	}
	if c.L7Mark == 0 {
		c.L7Mark, c.L7MarkMask = datapath.DefaultL7Mark, datapath.DefaultL7MarkMask
	}
	if c.FlowWindow <= 0 {
		c.FlowWindow = datapath.DefaultFlowWindow
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
