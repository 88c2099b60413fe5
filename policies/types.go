package policies

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FormatVersion is the policy format version this package reads and writes.
const FormatVersion = 1

// Action is a rule's verdict: allow or deny.
type Action string

// Actions.
const (
	Allow Action = "allow"
	Deny  Action = "deny"
)

// Mode is how a policy, or one of its rules, is applied: enforce (deny what it denies)
// or audit (let it pass, but audit what enforce would have denied as would_deny). The
// platform floor (the operator overlay and the special-address guard) is enforced in
// every mode.
type Mode string

// Modes.
const (
	Enforce Mode = "enforce"
	// AuditMode lets through what the policy (or the rule) would deny, marking the
	// decision WouldDeny. Written "audit"; the older spelling "report" is read as audit.
	AuditMode Mode = "audit"
	// Report is the former name of AuditMode, kept for callers; Parse reads the
	// spelling "report" as AuditMode.
	Report = AuditMode
)

// legacyReport is the spelling of AuditMode before enforcement modes per rule.
const legacyReport Mode = "report"

// normalMode maps the legacy spelling "report" to AuditMode.
func normalMode(m Mode) Mode {
	if m == legacyReport {
		return AuditMode
	}
	return m
}

// L7Mode says whether TCP 80/443 are redirected to egressd's proxy, which checks the
// HTTP Host / TLS SNI against the policy and that the destination IP was learned for
// that name.
type L7Mode string

// L7 modes.
const (
	L7Off L7Mode = "off"
	L7SNI L7Mode = "sni"
)

// AuditLevel says which decisions are written to the audit log.
type AuditLevel string

// Audit levels.
const (
	// AuditAll records every decision.
	AuditAll AuditLevel = "all"
	// AuditDenied records denials and report-mode would-denials only.
	AuditDenied AuditLevel = "denied"
)

// Protocol is a transport protocol a rule may be limited to. The empty Protocol in a
// query means "any protocol".
type Protocol string

// Protocols.
const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// PortRange is an inclusive range of ports, First ≤ Last, both in 1..65535. In YAML and
// JSON a single port is a number (443) and a range a string ("8000-8100").
type PortRange struct {
	First, Last uint16
}

// Contains reports whether port is in the range.
func (r PortRange) Contains(port uint16) bool { return port >= r.First && port <= r.Last }

// String returns "443" or "8000-8100".
func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// MarshalJSON writes a number for one port and a "first-last" string for a range.
func (r PortRange) MarshalJSON() ([]byte, error) {
	if r.First == r.Last {
		return []byte(strconv.Itoa(int(r.First))), nil
	}
	return json.Marshal(r.String())
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *PortRange) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	pr, err := ParsePortRange(s)
	if err != nil {
		return err
	}
	*r = pr
	return nil
}

// ParsePortRange parses "443" or "8000-8100".
func ParsePortRange(s string) (PortRange, error) {
	first, last, isRange := strings.Cut(strings.TrimSpace(s), "-")
	a, err := parsePort(first)
	if err != nil {
		return PortRange{}, err
	}
	if !isRange {
		return PortRange{a, a}, nil
	}
	b, err := parsePort(last)
	if err != nil {
		return PortRange{}, err
	}
	if b < a {
		return PortRange{}, fmt.Errorf("port range %q ends before it starts", s)
	}
	return PortRange{a, b}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number in 1..65535", s)
	}
	return uint16(n), nil
}

// Rule is one egress rule. Rules are evaluated in order; the first whose target, ports
// and protocols all match decides.
type Rule struct {
	// Action is allow or deny.
	Action Action `json:"action"`
	// Target is what the rule matches:
	//   - an exact name: "pypi.org" (case-insensitive, a trailing dot is ignored);
	//   - a wildcard "*.example.com": every name below example.com, at any depth, but
	//     not example.com itself;
	//   - "*" or "**": everything (names and addresses);
	//   - an IPv4/IPv6 address ("203.0.113.7", "2001:db8::1") or CIDR ("10.0.0.0/8").
	Target string `json:"target"`
	// Ports limits the rule to these destination ports; empty means every port.
	Ports []PortRange `json:"ports,omitempty"`
	// Protocols limits the rule to tcp and/or udp; empty means both.
	Protocols []Protocol `json:"protocols,omitempty"`
	// Comment is free text shown by `airlock policy explain`.
	Comment string `json:"comment,omitempty"`
	// Mode overrides the policy's mode for this rule: on a deny rule, audit lets what
	// it denies pass as would_deny (and enforce enforces it in a policy in audit mode);
	// on an allow rule with HTTP rules it is the default mode of those rules. Empty: the
	// policy's mode.
	Mode Mode `json:"mode,omitempty"`
	// HTTP, on an allow rule for a name, holds the rules every HTTP request to that host
	// must pass (http.go); nil: none, the host is decided by name only.
	HTTP *HTTPRules `json:"http,omitempty"`
	// Line is the rule's line in its source document (0 when built in code).
	Line   int `json:"-"`
	column int
	src    string // the source document's name, when parsed
}

// Policy is a parsed, validated policy document. Its JSON form (encoding/json) is the
// Airlock policy in JSON, which Parse reads back; when no Airlock extension is used it is
// exactly the OpenSandbox networkPolicy shape {defaultAction, egress:[{action,target}]}.
// Unset fields take their defaults at compile time (see the accessors).
type Policy struct {
	// Version is the format version; 0 (absent) means FormatVersion.
	Version int `json:"version,omitempty"`
	// Name is a label for humans and logs.
	Name string `json:"name,omitempty"`
	// Mode is enforce (default) or audit (see Mode).
	Mode Mode `json:"mode,omitempty"`
	// DefaultAction applies when no rule matches; default deny (as in OpenSandbox).
	DefaultAction Action `json:"defaultAction,omitempty"`
	// Egress is the ordered rule list; first match wins.
	Egress []Rule `json:"egress"`
	// DNS holds the resolver options; nil means the defaults.
	DNS *DNSOptions `json:"dns,omitempty"`
	// L7 is off (default) or sni.
	L7 L7Mode `json:"l7,omitempty"`
	// Audit is all (default) or denied.
	Audit AuditLevel `json:"audit,omitempty"`
	// Source names where the document came from (a file name), for messages.
	Source string `json:"-"`
}

// EffectiveMode returns Mode or its default, enforce ("report" reads as audit).
func (p *Policy) EffectiveMode() Mode {
	if p.Mode == "" {
		return Enforce
	}
	return normalMode(p.Mode)
}

// RuleMode returns the effective mode of rule r of p: its own Mode, else the policy's.
func (p *Policy) RuleMode(r *Rule) Mode {
	if r.Mode != "" {
		return normalMode(r.Mode)
	}
	return p.EffectiveMode()
}

// HasAuditRules reports whether the policy audits instead of enforcing anywhere: in
// audit mode, or with a rule (or HTTP rule) in audit mode.
func (p *Policy) HasAuditRules() bool {
	if p == nil {
		return false
	}
	if p.EffectiveMode() == AuditMode {
		return true
	}
	for i := range p.Egress {
		r := &p.Egress[i]
		if normalMode(r.Mode) == AuditMode {
			return true
		}
		if r.HTTP != nil && slices.ContainsFunc(r.HTTP.Rules, func(h HTTPRule) bool { return normalMode(h.Mode) == AuditMode }) {
			return true
		}
	}
	return false
}

// EffectiveDefault returns DefaultAction or its default, deny.
func (p *Policy) EffectiveDefault() Action {
	if p.DefaultAction == "" {
		return Deny
	}
	return p.DefaultAction
}

// EffectiveL7 returns L7 or its default: sni when some rule has HTTP rules (the L7
// proxy enforces them), else off.
func (p *Policy) EffectiveL7() L7Mode {
	if p.L7 == "" {
		if p.HasHTTP() {
			return L7SNI
		}
		return L7Off
	}
	return p.L7
}

// EffectiveAudit returns Audit or its default, all.
func (p *Policy) EffectiveAudit() AuditLevel {
	if p.Audit == "" {
		return AuditAll
	}
	return p.Audit
}

// Clone returns a deep copy of p.
func (p *Policy) Clone() *Policy {
	if p == nil {
		return nil
	}
	c := *p
	c.Egress = make([]Rule, len(p.Egress))
	for i, r := range p.Egress {
		r.Ports = append([]PortRange(nil), r.Ports...)
		r.Protocols = append([]Protocol(nil), r.Protocols...)
		r.HTTP = r.HTTP.clone()
		c.Egress[i] = r
	}
	if p.DNS != nil {
		d := p.DNS.clone()
		c.DNS = &d
	}
	return &c
}

// DNSOptions are the resolver options of a policy. Zero fields take the defaults below.
type DNSOptions struct {
	// QueryTypes lists the allowed query types by name; default A, AAAA, CNAME, HTTPS,
	// SVCB. Other types are answered NOTIMP (or REFUSED, by dnsfilter configuration).
	QueryTypes []string `json:"queryTypes,omitempty"`
	// MaxLabelLength is the longest label accepted in a query name, 1..63; default 63.
	MaxLabelLength int `json:"maxLabelLength,omitempty"`
	// MaxNameLength is the longest query name accepted (presentation form, no trailing
	// dot), 1..253; default 253.
	MaxNameLength int `json:"maxNameLength,omitempty"`
	// TunnelGuard limits high-entropy labels and per-domain query rates; nil means the
	// defaults.
	TunnelGuard *TunnelGuard `json:"tunnelGuard,omitempty"`
}

func (o DNSOptions) clone() DNSOptions {
	o.QueryTypes = append([]string(nil), o.QueryTypes...)
	if o.TunnelGuard != nil {
		g := *o.TunnelGuard
		if g.MaxLabelEntropy != nil {
			v := *g.MaxLabelEntropy
			g.MaxLabelEntropy = &v
		}
		o.TunnelGuard = &g
	}
	return o
}

// TunnelGuard is the DNS tunnelling guard: data smuggled out through DNS shows up as long,
// random-looking labels and as many distinct names under one domain.
type TunnelGuard struct {
	// MaxLabelEntropy is the highest Shannon entropy, in bits per character, accepted for
	// a label of at least MinLabelLength characters; default 4.0. Random base32/base64
	// labels score above 4.2, hex and words below 4 (dnsfilter's label score, which
	// measures bits per label, catches long hex). 0 turns off both label checks: this one
	// and dnsfilter's label score.
	MaxLabelEntropy *float64 `json:"maxLabelEntropy,omitempty"`
	// MinLabelLength is the shortest label the entropy check scores; default 24.
	MinLabelLength int `json:"minLabelLength,omitempty"`
	// MaxQueriesPerMinute caps the distinct names under one registrable domain (eTLD+1:
	// a.b.example.co.uk counts under example.co.uk) that a sandbox may resolve per
	// minute; 0 (the default) leaves dnsfilter's operator cap in force (100 unless the
	// operator set another). dnsfilter enforces it, beside its per-sandbox and per-rule
	// caps, which the policy cannot raise.
	MaxQueriesPerMinute int `json:"maxQueriesPerMinute,omitempty"`
}
