package policies

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
)

// Decider is a compiled policy: immutable and safe for concurrent use. Decisions never
// perform I/O and do not allocate on the concrete-port paths.
type Decider struct {
	policy  *Policy
	version uint64
	mode    Mode
	def     Action
	l7      L7Mode
	audit   AuditLevel
	dns     DNSSettings

	deny, allow, rules *ruleSet
	ipRules            []IPRule
	hasV6              bool
}

// Decision is the outcome for one destination. A deny is a value, not an error.
type Decision struct {
	// Action is what to enforce. A denial by a rule (or the default) in audit mode
	// becomes Allow with WouldDeny set, Rule naming what would have denied; overlay
	// denials and the special-address guard are always enforced.
	Action    Action
	WouldDeny bool
	// Mode is the policy's mode.
	Mode Mode
	// Rule identifies what decided: "egress[3]", "overlay.alwaysDeny[0]",
	// "overlay.alwaysAllow[1]", "default", or "guard" (special-address guard).
	Rule string
	// Reason says why, for humans and the audit log.
	Reason string
	// Ports is, for a name asked about at any port (port 0, no protocol), every port
	// the name may reach; empty otherwise.
	Ports PortSet
	// Version is the policy revision (CompileOptions.Version).
	Version uint64
	// HTTP, on an allow decision by a rule with HTTP rules, is what every request to
	// the host must pass (HTTPHost.Decide): the connection is allowed only through the
	// L7 proxy, request by request. Nil otherwise.
	HTTP *HTTPHost
}

// Allowed reports whether the destination may be reached.
func (d Decision) Allowed() bool { return d.Action == Allow }

// IPRule is a static address rule, for datapaths that keep prefixes in an LPM trie.
type IPRule struct {
	Prefix    netip.Prefix
	Action    Action
	Ports     []PortRange // empty: every port
	Protocols []Protocol  // empty: tcp and udp
	// CatchAll marks a "*" rule (listed as 0.0.0.0/0 and ::/0): a catch-all allow does
	// not cover special addresses (SpecialPrefixes), which need an explicit rule.
	CatchAll bool
	// Rule is the rule's reference, as in Decision.Rule.
	Rule string
	// Overlay marks a rule of the operator overlay, which audit mode does not relax.
	Overlay bool
	// Audit marks a deny rule of the policy whose effective mode (Policy.RuleMode) is
	// audit: what it matches passes and is reported as would-deny, except special
	// addresses (Classify), which stay denied (the guard) in every mode.
	Audit bool
}

// Policy returns a copy of the source policy.
func (d *Decider) Policy() *Policy { return d.policy.Clone() }

// Version returns the policy revision.
func (d *Decider) Version() uint64 { return d.version }

// Mode returns the policy's mode, enforce or audit (rules may override it: IPRule.Audit,
// Decision.WouldDeny).
func (d *Decider) Mode() Mode { return d.mode }

// DefaultAction returns the action when no rule matches.
func (d *Decider) DefaultAction() Action { return d.def }

// L7 returns the L7 mode.
func (d *Decider) L7() L7Mode { return d.l7 }

// AuditLevel returns which decisions to audit.
func (d *Decider) AuditLevel() AuditLevel { return d.audit }

// ShouldAudit reports whether a decision is written under the audit level.
func (d *Decider) ShouldAudit(dec Decision) bool {
	return d.audit != AuditDenied || dec.Action == Deny || dec.WouldDeny
}

// DNS returns the resolved DNS options.
func (d *Decider) DNS() DNSSettings { return d.dns }

// HasIPv6 reports whether the policy's own rules include an IPv6 prefix (the overlay's
// built-in IPv6 denials do not count).
func (d *Decider) HasIPv6() bool { return d.hasV6 }

// IPRules returns the static address rules in evaluation order (overlay deny, overlay
// allow, then the policy's rules). The caller must not modify the result.
func (d *Decider) IPRules() []IPRule { return d.ipRules }

// Decide decides a target given as text: an IP address goes to DecideAddr, anything
// else is a name for DecideName. Port 0 means any port and proto "" any protocol.
func (d *Decider) Decide(target string, port uint16, proto Protocol) Decision {
	if a, err := netip.ParseAddr(strings.TrimSpace(target)); err == nil {
		return d.DecideAddr(a, port, proto)
	}
	return d.DecideName(target, port, proto)
}

// decision builds a Decision; a denial with audit set (a rule or default in audit mode)
// becomes Allow with WouldDeny.
func (d *Decider) decision(a Action, rule, reason string, audit bool) Decision {
	dec := Decision{Action: a, Mode: d.mode, Rule: rule, Reason: reason, Version: d.version}
	if a == Deny && audit {
		dec.Action, dec.WouldDeny = Allow, true
	}
	return dec
}

// defaultDecision is the decision of the default action (audited in audit mode).
func (d *Decider) defaultDecision() Decision {
	return d.decision(d.def, "default", defaultReason[d.def], d.mode == AuditMode)
}

func (d *Decider) ruleDecision(s *ruleSet, i int32) Decision {
	r := &s.rules[i]
	dec := d.decision(r.action, r.ref, r.desc, r.audit)
	dec.HTTP = r.http
	return dec
}

func (r *crule) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.action, r.target)
	if r.ports != nil {
		ps := make([]string, len(r.ports))
		for i, p := range r.ports {
			ps[i] = p.String()
		}
		fmt.Fprintf(&b, " ports %s", strings.Join(ps, ","))
	}
	if len(r.raw.Protocols) > 0 && r.protos != 0 {
		fmt.Fprintf(&b, " %s", r.raw.Protocols[0])
	}
	if r.line > 0 {
		fmt.Fprintf(&b, " (%s:%d)", r.source, r.line)
	}
	return b.String()
}

// DecideName decides a domain name (case and a trailing dot do not matter). With a
// concrete port or protocol it returns the first matching rule's verdict (overlay first);
// with port 0 and no protocol it answers "may anything at this name be reached", the DNS
// question, and fills Decision.Ports with what may.
func (d *Decider) DecideName(name string, port uint16, proto Protocol) Decision {
	name = NormalizeName(name)
	if port == 0 && proto == "" {
		return d.nameScope(name)
	}
	if i := d.deny.firstName(name, port, proto); i >= 0 {
		return d.ruleDecision(d.deny, i)
	}
	if i := d.allow.firstName(name, port, proto); i >= 0 {
		return d.ruleDecision(d.allow, i)
	}
	if i := d.rules.firstName(name, port, proto); i >= 0 {
		return d.ruleDecision(d.rules, i)
	}
	return d.defaultDecision()
}

var defaultReason = map[Action]string{Allow: "no rule matches; default allow", Deny: "no rule matches; default deny"}

// nameScope evaluates every rule matching name in order, port range by port range.
// Without port-limited rules the first match decides everything (the fast path).
func (d *Decider) nameScope(name string) Decision {
	if !d.deny.restricted && !d.allow.restricted && !d.rules.restricted {
		dec := d.defaultDecision()
		for _, s := range []*ruleSet{d.deny, d.allow, d.rules} {
			if i := s.firstName(name, 0, ""); i >= 0 {
				dec = d.ruleDecision(s, i)
				break
			}
		}
		if dec.Action == Allow {
			dec.Ports = PortSet{TCP: allPorts, UDP: allPorts}
		}
		return dec
	}
	undecided := PortSet{TCP: allPorts, UDP: allPorts}
	// passable: what may be reached, allowed or let through by a rule (or the
	// default) in audit mode; allowed ⊆ passable.
	var allowed, passable PortSet
	var firstAllow, firstDeny, firstAudit *crule
	apply := func(s *ruleSet) {
		for _, i := range s.nameMatches(name) {
			r := &s.rules[i]
			sc := r.scope()
			tcp, udp := intersect(undecided.TCP, sc.TCP), intersect(undecided.UDP, sc.UDP)
			if len(tcp)+len(udp) == 0 {
				continue
			}
			if r.action == Allow {
				allowed.TCP, allowed.UDP = union(allowed.TCP, tcp), union(allowed.UDP, udp)
				if firstAllow == nil {
					firstAllow = r
				}
			} else if firstDeny == nil {
				firstDeny = r
			}
			if r.action == Deny && r.audit && firstAudit == nil {
				firstAudit = r
			}
			if r.action == Allow || r.audit {
				passable.TCP, passable.UDP = union(passable.TCP, tcp), union(passable.UDP, udp)
			}
			undecided.TCP, undecided.UDP = subtract(undecided.TCP, sc.TCP), subtract(undecided.UDP, sc.UDP)
		}
	}
	apply(d.deny)
	apply(d.allow)
	apply(d.rules)
	defaultAudit := false
	if !undecided.Empty() {
		if d.def == Allow {
			allowed.TCP, allowed.UDP = union(allowed.TCP, undecided.TCP), union(allowed.UDP, undecided.UDP)
		}
		if d.def == Allow || d.mode == AuditMode {
			passable.TCP, passable.UDP = union(passable.TCP, undecided.TCP), union(passable.UDP, undecided.UDP)
			defaultAudit = d.def == Deny
		}
	}
	if !allowed.Empty() {
		dec := Decision{Action: Allow, Mode: d.mode, Rule: "default", Reason: defaultReason[Allow], Version: d.version}
		if firstAllow != nil {
			dec.Rule, dec.Reason = firstAllow.ref, firstAllow.desc
		}
		dec.Ports = passable
		return dec
	}
	if !passable.Empty() {
		// Nothing is allowed, but a rule or the default in audit mode lets some
		// ports through: would-deny, naming the first such rule.
		dec := d.decision(Deny, "default", defaultReason[Deny], true)
		if firstAudit != nil && (!defaultAudit || firstDeny == firstAudit) {
			dec = d.decision(Deny, firstAudit.ref, firstAudit.desc, true)
		}
		dec.Ports = passable
		return dec
	}
	if firstDeny != nil {
		return d.decision(Deny, firstDeny.ref, firstDeny.desc, false)
	}
	return d.decision(Deny, "default", defaultReason[Deny], false)
}

// DecideAddr decides a destination address reached directly (not through a name):
// overlay first, then the first matching policy rule, then the default. Special
// addresses (Classify) are reached only through an explicit IP/CIDR allow rule: catch-all
// allows and the default skip them, and without an explicit rule they are denied by the
// "guard", in report mode too.
func (d *Decider) DecideAddr(a netip.Addr, port uint16, proto Protocol) Decision {
	a = a.WithZone("")
	class := Classify(a)
	if i := d.deny.firstAddr(a, port, proto, false, false); i >= 0 {
		return d.ruleDecision(d.deny, i)
	}
	if i := d.allow.firstAddr(a, port, proto, false, false); i >= 0 {
		return d.ruleDecision(d.allow, i)
	}
	if i := d.rules.firstAddr(a, port, proto, class.Special(), false); i >= 0 {
		if class.Special() && d.rules.rules[i].audit {
			return d.guard(a, class) // audit mode never opens the floor
		}
		return d.ruleDecision(d.rules, i)
	}
	if class.Special() {
		return d.guard(a, class)
	}
	return d.defaultDecision()
}

// DecideLearned classifies an address that an allowed name resolved to, before it is
// learned: overlay first, then explicit IP/CIDR rules of the policy (catch-alls do not
// apply: the name's decision stands), then the special-address guard (no DNS rebinding
// into private, CGNAT, link-local, loopback or IPv4-mapped addresses unless a rule
// allows them explicitly), else allow. Port 0 and proto "" ask about any port.
func (d *Decider) DecideLearned(name string, a netip.Addr, port uint16, proto Protocol) Decision {
	a = a.WithZone("")
	class := Classify(a)
	if i := d.deny.firstAddr(a, port, proto, false, false); i >= 0 {
		return d.ruleDecision(d.deny, i)
	}
	if i := d.allow.firstAddr(a, port, proto, false, true); i >= 0 {
		return d.ruleDecision(d.allow, i)
	}
	if i := d.rules.firstAddr(a, port, proto, false, true); i >= 0 {
		if !(class.Special() && d.rules.rules[i].audit) {
			return d.ruleDecision(d.rules, i)
		}
	}
	if class.Special() {
		dec := d.guard(a, class)
		dec.Reason = fmt.Sprintf("%s resolved to %s", NormalizeName(name), dec.Reason)
		return dec
	}
	return Decision{Action: Allow, Mode: d.mode, Rule: "learned", Version: d.version,
		Reason: fmt.Sprintf("address of allowed name %s", NormalizeName(name))}
}

func (d *Decider) guard(a netip.Addr, class AddrClass) Decision {
	return Decision{Action: Deny, Mode: d.mode, Rule: "guard", Version: d.version,
		Reason: fmt.Sprintf("%s is a %s address; only an explicit IP/CIDR rule allows it", a, class)}
}

// Match is one rule that matches a target, for Explain.
type Match struct {
	// Rule is the reference ("egress[2]"), Layer its list.
	Rule, Layer string
	Action      Action
	Target      string
	// Scope is the rule's ports and protocols ("all" or "tcp:443").
	Scope string
	// Covers reports whether the rule applies at the asked port/protocol.
	Covers bool
	// Line is the rule's line in its source (0 when unknown), Source that source.
	Line    int
	Source  string
	Comment string
}

// Explain returns the decision for target at port/proto together with every rule whose
// target matches, in evaluation order, so a human can see what decides and what is
// shadowed.
func (d *Decider) Explain(target string, port uint16, proto Protocol) (Decision, []Match) {
	dec := d.Decide(target, port, proto)
	a, err := netip.ParseAddr(strings.TrimSpace(target))
	isAddr := err == nil
	name := NormalizeName(strings.TrimSpace(target))
	var out []Match
	for _, s := range []*ruleSet{d.deny, d.allow, d.rules} {
		var idx []int32
		if isAddr {
			idx = s.addrMatches(a.WithZone(""))
		} else {
			idx = s.nameMatches(name)
		}
		for _, i := range slices.Compact(idx) {
			r := &s.rules[i]
			out = append(out, Match{Rule: r.ref, Layer: s.layer, Action: r.action, Target: r.target.String(),
				Scope: r.scope().String(), Covers: r.covers(port, proto), Line: r.line, Source: r.source,
				Comment: r.raw.Comment})
		}
	}
	return dec, out
}

// AllowsType reports whether the numeric query type is allowed.
func (s DNSSettings) AllowsType(qtype uint16) bool { return s.qtypes[qtype] }

// CheckName applies the length limits and the entropy guard to a query name (presentation
// form, trailing dot optional). It returns "" when the name passes, else the reason.
func (s DNSSettings) CheckName(name string) string {
	name = strings.TrimSuffix(name, ".")
	if len(name) > s.MaxNameLength {
		return fmt.Sprintf("name is %d characters long (limit %d)", len(name), s.MaxNameLength)
	}
	for label := range strings.SplitSeq(name, ".") {
		if len(label) > s.MaxLabelLength {
			return fmt.Sprintf("label of %d characters (limit %d)", len(label), s.MaxLabelLength)
		}
		if s.MaxLabelEntropy > 0 && len(label) >= s.MinEntropyLabelLength {
			if e := LabelEntropy(label); e > s.MaxLabelEntropy {
				return fmt.Sprintf("label entropy %.2f bits/char above %.2f (possible DNS tunnelling)", e, s.MaxLabelEntropy)
			}
		}
	}
	return ""
}

// LabelEntropy returns the Shannon entropy of label's characters in bits per character,
// case-insensitively.
func LabelEntropy(label string) float64 {
	var counts [256]int
	for i := 0; i < len(label); i++ {
		c := label[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		counts[c]++
	}
	n := float64(len(label))
	var h float64
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}
