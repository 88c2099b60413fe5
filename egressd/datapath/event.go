package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Event is one datapath decision worth auditing.
type Event struct {
	// Time is when the kernel saw the packet (wall clock, converted from the
	// monotonic clock for eBPF).
	Time time.Time
	// Sandbox is the sandbox id ("" when the packet came from an interface the
	// datapath has no configuration for).
	Sandbox string
	Kind    Kind
	Reason  Reason
	Proto   Proto
	Src     netip.AddrPort
	Dst     netip.AddrPort
	// Rule is the static rule's ID for ReasonRuleAllow/ReasonRuleDeny, else 0.
	Rule uint16
	// Refused is set for a drop refused at the socket (connect or sendmsg failed with
	// EPERM, eBPF cgroup programs): no packet left the sandbox, Src has port 0.
	Refused bool
	// Bytes is the packet's length (0 when Refused).
	Bytes uint32
	// Process is the process that opened the flow, captured by the kernel when it
	// called connect() or sendmsg() (eBPF cgroup programs; on the nftables datapath
	// those of its Attributor); nil when unknown (attribution off or unavailable, a
	// raw socket, or an entry evicted).
	Process *Process
}

// Process is the process behind a flow as the kernel saw it in the calling task, all
// ids in the host's (the initial) pid namespace.
type Process struct {
	// PID is the process (thread group) id, TID the calling thread's.
	PID, TID uint32
	// PPID is the real parent's PID when the call was made.
	PPID uint32
	// PGID is the process group: execd starts every command in a group of its own,
	// led by the command's first process, which descendants keep when they are
	// re-parented (a background job).
	PGID uint32
	// NSPID and NSPGID are PID and PGID in the process's own pid namespace (the
	// sandbox's); 0 when unknown.
	NSPID, NSPGID uint32
	// Comm is the task's name (at most 15 bytes, the kernel's comm).
	Comm string
	// Exe is the name of the executable the process runs (the last element of its
	// path, at most 31 bytes), from the kernel's mm->exe_file; "" when unknown.
	Exe string
	// Args is the command line as the process held it (argv, read from its memory;
	// at most 128 bytes, ArgsCut when there was more); nil when unreadable.
	Args    []string
	ArgsCut bool
	// Start is when the process (its thread group leader) started, since boot
	// (CLOCK_BOOTTIME): /proc/<PID>/stat's starttime in nanoseconds. With PID it
	// names the process across pid reuse.
	Start time.Duration
}

// Attributor records, in the kernel, which process opened each flow of the sandboxes
// it watches, for a datapath that cannot see processes itself: the nftables backend
// (egressd/nftfilter.Config.Attribution). The eBPF backend's socket-layer programs,
// loaded recording only (they decide nothing: enforcement stays the datapath's), are
// one (ebpf.Config.OpenAttribution, handed in by the composition root through
// egressd/enforcer). Its methods are safe for concurrent use.
type Attributor interface {
	// Watch starts recording the processes of spec.Cgroup (its sub-cgroups
	// included) that connect or send, under spec.ID; the sandbox's own addresses
	// (spec.Addrs) are the local addresses of its UDP flows. Watching an id again
	// replaces its cgroup and addresses. A spec without a Cgroup is not watched
	// (nil). Errors name the cgroup; nothing of the failed watch is left.
	Watch(spec Spec) error
	// Unwatch stops recording id's processes and removes every hook of it; an id
	// not watched is nil.
	Unwatch(id string) error
	// Process returns the process that opened the flow of e's 5-tuple (e.Src the
	// sandbox's side, TCP or UDP), nil when none was recorded (another protocol, a
	// raw socket, an entry evicted).
	Process(e Event) *Process
	// Close unwatches every sandbox and unloads the programs: nothing stays in the
	// kernel or in bpffs.
	Close() error
}

// DefaultFlowWindow is the flow window of datapaths that do not say otherwise: packets
// of one 5-tuple less than this apart are one flow (one audit record).
const DefaultFlowWindow = 2 * time.Second

// FlowCount is the kernel's account of one flow: the packets of a 5-tuple that arrived
// less than the backend's flow window apart (for an allowed flow, those the sandbox
// sent).
type FlowCount struct {
	First, Last    time.Time
	Packets, Bytes uint64
}

// FlowCounter is implemented by datapaths that count flows in the kernel and report
// only a flow's first packet as an event (eBPF): denied flows always, allowed flows of
// policies with CountFlows. Without it every dropped packet is an event and the
// consumer counts, and allowed flows have no counts.
type FlowCounter interface {
	// FlowCount returns the counters of the flow of e's 5-tuple (KindDrop: the denied
	// flow; KindFlow: the allowed one). ok is false when the kernel holds no such flow
	// or does not count it (evicted, the sandbox detached, CountFlows off). The
	// counters belong to a later flow of the same 5-tuple when First is not e.Time.
	FlowCount(e Event) (c FlowCount, ok bool)
	// FlowWindow is the flow window: a packet less than this after the flow's
	// last packet belongs to the flow.
	FlowWindow() time.Duration
}

// String renders the event for logs and test failures.
func (e Event) String() string {
	return fmt.Sprintf("%s %s %s %s %s->%s rule=%d refused=%t", e.Sandbox, e.Kind, e.Reason, e.Proto, e.Src, e.Dst, e.Rule, e.Refused)
}

// Kind says what an event reports.
type Kind uint8

const (
	KindFlow      Kind = 1 // a new flow was allowed
	KindDrop      Kind = 2 // a packet was dropped
	KindWouldDrop Kind = 3 // report mode: a packet that enforce mode would drop passed
)

// String returns "flow", "drop" or "would_drop".
func (k Kind) String() string {
	switch k {
	case KindFlow:
		return "flow"
	case KindDrop:
		return "drop"
	case KindWouldDrop:
		return "would_drop"
	}
	return "kind_" + itoa(int(k))
}

// MarshalText implements encoding.TextMarshaler.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Reason says why a packet was allowed or dropped. The numbers are shared with the
// eBPF program (ebpf/airlock.c) and the nftables log prefixes.
type Reason uint8

const (
	ReasonRuleAllow    Reason = 1  // a static allow rule matched
	ReasonLearned      Reason = 2  // the destination was learned from DNS and is live
	ReasonDefaultAllow Reason = 3  // nothing matched and the default is allow
	ReasonRuleDeny     Reason = 10 // a static deny rule matched
	ReasonDefaultDeny  Reason = 11 // nothing matched and the default is deny
	ReasonDNS          Reason = 12 // port 53 to an address that is not the resolver
	ReasonDoT          Reason = 13 // port 853
	ReasonIPv6Blocked  Reason = 14 // IPv6 while the policy blocks it
	ReasonSpoofed      Reason = 15 // source address is not the sandbox's
	ReasonNoConfig     Reason = 16 // hooked interface with no sandbox configuration
	ReasonMalformed    Reason = 17 // truncated or unparsable header
	ReasonEthertype    Reason = 18 // neither ARP, IPv4 nor IPv6
)

var reasonNames = map[Reason]string{
	ReasonRuleAllow: "rule_allow", ReasonLearned: "learned", ReasonDefaultAllow: "default_allow",
	ReasonRuleDeny: "rule_deny", ReasonDefaultDeny: "default_deny", ReasonDNS: "dns_not_resolver",
	ReasonDoT: "dot", ReasonIPv6Blocked: "ipv6_blocked", ReasonSpoofed: "spoofed_source",
	ReasonNoConfig: "no_config", ReasonMalformed: "malformed", ReasonEthertype: "ethertype",
}

// Reasons lists every reason, for metrics label sets.
func Reasons() []Reason {
	var rs []Reason
	for r := range reasonNames {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

// String returns the reason's snake_case name.
func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return "reason_" + itoa(int(r))
}

// MarshalText implements encoding.TextMarshaler.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Stats are counters since the state was created (they survive restarts for eBPF,
// where they live in pinned maps) and current table sizes.
type Stats struct {
	Backend Backend
	// Packets passed and dropped on all attached interfaces.
	Passed, Dropped uint64
	// FlowsNew counts new allowed flows; Flows is the current flow table size.
	FlowsNew uint64
	Flows    int
	// EventsLost counts events lost in the kernel ring buffer or on a full Events
	// channel.
	EventsLost uint64
	Sandboxes  map[string]SandboxStats
}

// SandboxStats are one sandbox's counters and table sizes.
type SandboxStats struct {
	Passed, Dropped, FlowsNew uint64
	// Rules is the number of static prefixes programmed, Learned the number of
	// learned addresses (live or expired but not yet collected), Flows the flows.
	Rules, Learned, Flows int
}
