// Package datapath defines the enforcement datapath that egressd drives: one Datapath
// per node, one attached sandbox per host-side veth, two implementations (the eBPF
// TC/TCX filter in package ebpf and the nftables filter in package egressd/nftfilter)
// with the same packet semantics. Package egressd/enforcer picks one.
//
// Packet semantics (both backends), for every packet the sandbox sends:
//
//  1. ARP and IPv6 neighbour discovery pass.
//  2. A source address that is not one of Spec.Addrs is dropped (ReasonSpoofed).
//  3. UDP/TCP port 53 passes only to Spec.Resolvers; any other port 53 is dropped
//     (ReasonDNS); port 853 (DoT/DoQ) is always dropped (ReasonDoT).
//  4. IPv6 is dropped when Policy.IPv6 is IPv6Block (ReasonIPv6Blocked).
//  5. A packet of an established flow passes: a flow is created by the first allowed
//     packet, or by an inbound TCP connection (so replies to the gateway pass), and
//     lives while packets keep flowing (idle timeouts, see each backend's README). A
//     flow outlives the learned entry that allowed it.
//  6. Otherwise the static rules are evaluated in order; the first rule whose prefix,
//     protocol and port range match decides (allow or deny).
//  7. With Policy.L7, TCP 80/443 is marked for redirection to the local L7 proxy
//     (see L7 in the backend READMEs); the proxy reads the original destination.
//  8. A live learned grant (Learn, not yet expired) allows the address: on every port,
//     or on the protocols and port ranges it was learned for.
//  9. Otherwise Policy.Default decides.
//
// In audit mode (Policy.Report) every policy drop of steps 3, 4, 6 and 9 passes
// instead and is reported as KindWouldDrop, except a rule with ActionDenyAlways. A rule
// with ActionDenyAudit (a deny rule in audit mode in a policy that enforces) passes and
// reports KindWouldDrop in either mode. A new allowed flow is reported as KindFlow
// and a drop as KindDrop: eBPF reports the first packet of a denied flow (the
// packets of a 5-tuple less than 2 s apart) and counts the rest (FlowCounter);
// nftables reports every dropped packet and resets TCP (reset) or answers ICMP
// administratively prohibited for other protocols, so the caller fails at once.
// With Spec.Cgroup, eBPF refuses a denied connect or unconnected sendmsg with EPERM
// before any packet (Event.Refused).
package datapath

import (
	"errors"
	"net/netip"
	"time"
)

// Datapath enforces sandbox egress policies on this node. All methods are safe for
// concurrent use. Enforcement outlives the process: Close releases the handles but
// leaves every attached sandbox enforced (fail closed); a new Datapath on the same
// state root adopts them (Attached lists them) without a gap or a duplicate hook.
type Datapath interface {
	// Backend names the implementation in use.
	Backend() Backend

	// Attach starts enforcing spec on the sandbox's host-side veth. Attaching an id
	// that is already attached (for example adopted after a restart) replaces its
	// policy and addresses in place, keeping its learned entries and flows, with no
	// moment without enforcement. Errors: ErrInvalidSpec (nothing changed), ErrFull,
	// or a kernel error (nothing left behind).
	Attach(spec Spec) error

	// Update replaces the policy of an attached sandbox atomically: new packets see
	// either the old or the new policy. Established flows that the new policy denies
	// (neither a static allow nor a live learned entry) are cut. Errors:
	// ErrUnknownSandbox, ErrInvalidSpec (nothing changed).
	Update(id string, p Policy) error

	// Learn allows new flows from sandbox id to addr until now+ttl: on every port when
	// ports is empty, otherwise on those protocols and port ranges only (a name rule
	// with ports). Each grant (every port, or one protocol and range) has its own
	// expiry: learning a live grant again extends it to the later expiry, different
	// grants of an address accumulate (at most MaxLearnedGrants live ones). It is on
	// the DNS answer path: a map or set update, no listing, target ≤ 100 µs p50.
	// IPv4-mapped IPv6 addresses are unmapped. Errors: ErrUnknownSandbox,
	// ErrInvalidSpec (ttl ≤ 0, an invalid address or grant), ErrFull (the sandbox's
	// learned table, or the address's grants, are full).
	Learn(id string, addr netip.Addr, ports []ProtoPorts, ttl time.Duration) error

	// Forget removes a learned address and cuts established flows to it that the
	// static rules do not allow. Forgetting an unknown address is not an error.
	Forget(id string, addr netip.Addr) error

	// Narrow replaces a learned address's grants with ports (nil: every port) for ttl
	// and cuts only the established flows to it that the new grants and the static
	// rules no longer allow: a policy change that narrows a name's ports leaves the
	// flows on ports that stay allowed alone. Errors as Learn.
	Narrow(id string, addr netip.Addr, ports []ProtoPorts, ttl time.Duration) error

	// Detach stops enforcing on the sandbox and removes every hook, map entry, inner
	// map, rule and set created for it. Detaching an unknown id returns
	// ErrUnknownSandbox.
	Detach(id string) error

	// Attached lists the ids of the attached sandboxes, including those adopted from
	// a previous process, sorted.
	Attached() []string

	// Events delivers new-flow, drop and would-drop events. The channel is closed by
	// Close. Events that cannot be delivered (a full channel or a full kernel ring
	// buffer) are counted in Stats.EventsLost, never blocking the datapath.
	Events() <-chan Event

	// Stats reads counters and table sizes. It lists kernel tables: not for hot paths.
	Stats() (Stats, error)

	// Close stops event delivery and releases handles. Enforcement stays in force.
	Close() error
}

// PolicyUpdate is one sandbox's new policy, for BatchUpdater.
type PolicyUpdate struct {
	ID     string
	Policy Policy
}

// LatestUpdates is the part of a batch a backend applies: the last update of each
// sandbox (earlier ones are superseded), its policy validated. errs[i] receives the
// validation error of ups[i]; superseded and invalid updates are not returned.
func LatestUpdates(ups []PolicyUpdate, errs []error) []IndexedUpdate {
	var out []IndexedUpdate
	seen := map[string]bool{}
	for i := len(ups) - 1; i >= 0; i-- {
		u := ups[i]
		if seen[u.ID] {
			continue
		}
		seen[u.ID] = true
		p, err := ValidatePolicy(u.Policy)
		if err != nil {
			errs[i] = err
			continue
		}
		out = append(out, IndexedUpdate{Index: i, ID: u.ID, Policy: p})
	}
	return out
}

// IndexedUpdate is one validated update of a batch and its index in the batch.
type IndexedUpdate struct {
	Index  int
	ID     string
	Policy Policy
}

// BatchUpdater is a Datapath that can update many sandboxes at once faster than one by
// one (the eBPF backend: one kernel grace period for all). UpdateMany is Update for each
// element; errs[i] is the error of ups[i] (nil when applied).
type BatchUpdater interface {
	UpdateMany(ups []PolicyUpdate) (errs []error)
}

// Backend names a datapath implementation.
type Backend string

const (
	BackendEBPF     Backend = "ebpf"
	BackendNFTables Backend = "nftables"
)

// Default L7 mark: both backends give it (under the mask) to TCP 80/443 of sandboxes in
// L7 mode (Policy.L7), and the nftables l7_redirect chain sends packets carrying it to
// the local proxy. Bits 16-31 of skb->mark; nothing else on the host may use them.
const (
	DefaultL7Mark     = 0x1a170000
	DefaultL7MarkMask = 0xffff0000
)

// ProtoPorts is one grant of a learned address: a protocol and a port range.
type ProtoPorts struct {
	Proto Proto     // ProtoTCP or ProtoUDP
	Ports PortRange // inclusive; the zero value is every port of Proto
}

// Spec is what Attach needs to enforce one sandbox.
type Spec struct {
	// ID is the sandbox id, 1 to 64 bytes.
	ID string
	// HostIfindex and HostIfname name the host side of the sandbox's veth (both
	// required: eBPF attaches by index, nftables hooks by name).
	HostIfindex int
	HostIfname  string
	// Addrs are the sandbox's own addresses (at most 4 per family); packets with any
	// other source address are dropped.
	Addrs []netip.Addr
	// Resolvers are the only addresses DNS (port 53) may go to: egressd's DNS filter.
	// At most one per family.
	Resolvers []netip.Addr
	Policy    Policy
	// Cgroup is the sandbox's cgroup v2 directory (for example
	// /sys/fs/cgroup/unified/docker/<container id>). When set, a backend that can
	// refuse at the socket attaches there too (eBPF: cgroup connect and sendmsg
	// programs return EPERM for a denied destination at once). Optional: without it
	// denied packets are dropped on the veth only.
	Cgroup string
}

// Policy is the compiled, address-level part of a sandbox's egress policy. Names are
// handled by the DNS filter, which calls Learn for allowed answers.
type Policy struct {
	// Rules are evaluated in order, first match wins (OpenSandbox egress semantics).
	// At most 16 rules may cover any one address.
	Rules []Rule
	// Default decides what no rule and no learned entry matched.
	Default Action
	// IPv6 selects whether IPv6 is filtered with the same semantics or fully blocked.
	// The zero value blocks.
	IPv6 IPv6Mode
	// L7 marks TCP 80/443 that no static rule decided for the L7 proxy.
	L7 bool
	// Report passes what would be dropped and reports it (mode: audit, formerly
	// report).
	Report bool
	// CountFlows counts the packets and bytes each allowed outbound flow sends, and
	// reports a flow that resumes after a flow window quiet as a new KindFlow event
	// (audit: all; read with FlowCounter where the backend has it).
	CountFlows bool
}

// Rule is one static, address-level rule.
type Rule struct {
	// Prefix is the destination network (IPv4 or IPv6; a single address is a /32 or
	// /128). Prefixes are masked.
	Prefix netip.Prefix
	// Proto restricts the rule to one protocol; ProtoAny matches every protocol.
	Proto Proto
	// Ports is the inclusive destination port range; the zero value matches every
	// port. A rule with ports never matches ICMP.
	Ports PortRange
	// Action is ActionAllow, ActionDeny, ActionDenyAlways or ActionDenyAudit.
	Action Action
	// ID is reported back in events (Event.Rule) so audit can name the rule; 0 is
	// "no id".
	ID uint16
}

// PortRange is an inclusive port range. The zero value means every port.
type PortRange struct {
	First, Last uint16
}

// All reports whether r covers every port.
func (r PortRange) All() bool {
	return (r.First == 0 && r.Last == 0) || (r.First == 0 && r.Last == 65535)
}

// Bounds returns the range with the zero value expanded to 0-65535.
func (r PortRange) Bounds() (uint16, uint16) {
	if r.All() {
		return 0, 65535
	}
	return r.First, r.Last
}

// Proto is an IP protocol number; ProtoAny (0) matches every protocol.
type Proto uint8

const (
	ProtoAny    Proto = 0
	ProtoICMP   Proto = 1
	ProtoTCP    Proto = 6
	ProtoUDP    Proto = 17
	ProtoICMPv6 Proto = 58
)

// String returns the protocol's name ("tcp", "udp", "icmp", "icmpv6", "any") or its number.
func (p Proto) String() string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoICMP:
		return "icmp"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMPv6:
		return "icmpv6"
	}
	return itoa(int(p))
}

// Action is a rule's or the default's verdict.
type Action uint8

const (
	ActionDeny  Action = 0
	ActionAllow Action = 1
	// ActionDenyAlways is a rule's deny that report mode does not relax: the operator
	// overlay and the special-address guard hold in report mode too, as in package
	// policies. Not a default action.
	ActionDenyAlways Action = 2
	// ActionDenyAudit is a rule's deny in audit mode (policies.IPRule.Audit) in a
	// policy that otherwise enforces: what it matches passes, reported as
	// KindWouldDrop, as if the policy were in report mode. Not a default action.
	ActionDenyAudit Action = 3
)

// String returns "allow" or "deny".
func (a Action) String() string {
	if a == ActionAllow {
		return "allow"
	}
	return "deny"
}

// IPv6Mode says how IPv6 is treated.
type IPv6Mode uint8

const (
	// IPv6Block drops all IPv6 except neighbour discovery and DNS to the resolver.
	IPv6Block IPv6Mode = 0
	// IPv6Filter applies the same semantics as IPv4.
	IPv6Filter IPv6Mode = 1
)

// Sentinel errors.
var (
	ErrInvalidSpec    = errors.New("datapath: invalid spec")
	ErrUnknownSandbox = errors.New("datapath: unknown sandbox")
	ErrFull           = errors.New("datapath: table full")
	ErrUnavailable    = errors.New("datapath: backend unavailable")
)

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [8]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
