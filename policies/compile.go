package policies

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// CompileOptions are the inputs to Compile besides the policy.
type CompileOptions struct {
	// Overlay is the operator's layer (nil: none). Callers normally pass BaseOverlay()
	// extended with the host's addresses and the control plane.
	Overlay *Overlay
	// Version is the policy revision stamped on decisions and audit records
	// (watch.Sandbox.PolicyVersion).
	Version uint64
}

// Load parses and compiles a policy document in one step: Parse, then Compile.
func Load(source string, data []byte, opts CompileOptions) (*Decider, error) {
	p, err := Parse(source, data)
	if err != nil {
		return nil, err
	}
	return Compile(p, opts)
}

// Compile builds the immutable Decider for p under opts. p must come from Parse (or
// satisfy the same rules); an invalid overlay target is an error wrapping ErrInvalid.
// The Decider keeps its own copy: later changes to p or the overlay do not affect it.
func Compile(p *Policy, opts CompileOptions) (*Decider, error) {
	if p == nil {
		p = &Policy{}
	}
	d := &Decider{
		policy:  p.Clone(),
		version: opts.Version,
		mode:    p.EffectiveMode(),
		def:     p.EffectiveDefault(),
		l7:      p.EffectiveL7(),
		audit:   p.EffectiveAudit(),
		dns:     compileDNS(p.DNS),
	}
	src := p.Source
	if src == "" {
		src = "policy"
	}
	var err error
	if opts.Overlay != nil {
		if d.deny, err = compileSet(layerDeny, "overlay", opts.Overlay.AlwaysDeny, Deny); err != nil {
			return nil, err
		}
		if d.allow, err = compileSet(layerAllow, "overlay", opts.Overlay.AlwaysAllow, Allow); err != nil {
			return nil, err
		}
	} else {
		d.deny, _ = compileSet(layerDeny, "overlay", nil, Deny)
		d.allow, _ = compileSet(layerAllow, "overlay", nil, Allow)
	}
	if d.rules, err = compileSet(layerEgress, src, p.Egress, ""); err != nil {
		return nil, err
	}
	for i := range d.rules.rules {
		r := &d.rules.rules[i]
		mode := p.RuleMode(&r.raw)
		r.audit = r.action == Deny && mode == AuditMode
		if r.raw.HTTP != nil && r.action == Allow {
			r.http = compileHTTP(r.ref, r.source, r.raw.HTTP, mode, d.version)
		}
	}
	for _, s := range []*ruleSet{d.deny, d.allow, d.rules} {
		for i := range s.rules {
			r := &s.rules[i]
			switch r.target.Kind {
			case KindPrefix:
				d.hasV6 = d.hasV6 || (s == d.rules && r.target.Prefix.Addr().Is6())
				d.ipRules = append(d.ipRules, r.ipRule(r.target.Prefix, false, s.layer != layerEgress))
			case KindAll:
				d.ipRules = append(d.ipRules,
					r.ipRule(netip.MustParsePrefix("0.0.0.0/0"), true, s.layer != layerEgress),
					r.ipRule(netip.MustParsePrefix("::/0"), true, s.layer != layerEgress))
			}
		}
	}
	return d, nil
}

// Layer names.
const (
	layerDeny   = "overlay.alwaysDeny"
	layerAllow  = "overlay.alwaysAllow"
	layerEgress = "egress"
)

// crule is a compiled rule.
type crule struct {
	action Action
	target Target
	ports  []PortRange // normalized; nil means every port
	protos uint8       // bit 0 tcp, bit 1 udp; 0 means both
	ref    string      // "egress[3]"
	line   int
	source string
	raw    Rule
	desc   string    // describe(), computed once
	http   *HTTPHost // the rule's HTTP rules; nil: none
	// audit: a deny of the policy whose effective mode is audit (its denials pass as
	// WouldDeny). Never set on the overlay.
	audit bool
}

const (
	protoTCP uint8 = 1 << iota
	protoUDP
)

func protoBit(p Protocol) uint8 {
	switch p {
	case TCP:
		return protoTCP
	case UDP:
		return protoUDP
	}
	return 0
}

// restricted reports whether the rule is limited to some ports or protocols.
func (r *crule) restricted() bool { return r.ports != nil || r.protos != 0 }

// covers reports whether the rule applies to port/proto. Port 0 with no protocol is the
// "any port" question: a restricted allow rule answers it (something is allowed), a
// restricted deny rule does not (something else may still be allowed).
func (r *crule) covers(port uint16, proto Protocol) bool {
	if port == 0 && proto == "" {
		return r.action == Allow || !r.restricted()
	}
	if b := protoBit(proto); b != 0 && r.protos != 0 && r.protos&b == 0 {
		return false
	}
	if port == 0 || r.ports == nil {
		return true
	}
	for _, pr := range r.ports {
		if pr.Contains(port) {
			return true
		}
	}
	return false
}

// scope returns the rule's ports per protocol.
func (r *crule) scope() PortSet {
	ports := r.ports
	if ports == nil {
		ports = allPorts
	}
	var s PortSet
	if r.protos == 0 || r.protos&protoTCP != 0 {
		s.TCP = ports
	}
	if r.protos == 0 || r.protos&protoUDP != 0 {
		s.UDP = ports
	}
	return s
}

func (r *crule) ipRule(p netip.Prefix, all, overlay bool) IPRule {
	return IPRule{Prefix: p, Action: r.action, Ports: r.raw.Ports, Protocols: r.raw.Protocols,
		CatchAll: all, Rule: r.ref, Overlay: overlay, Audit: r.audit}
}

// ruleSet is one layer's rules with its indexes. Index lists hold rule positions in
// ascending order, so the first covering entry of a list is that list's first match.
type ruleSet struct {
	layer  string
	rules  []crule
	exact  map[string][]int32
	suffix map[string][]int32 // key: the suffix without "*."
	all    []int32
	v4, v6 *trieNode
	// restricted is set when some rule has ports or protocols.
	restricted bool
}

func compileSet(layer, source string, rules []Rule, forced Action) (*ruleSet, error) {
	s := &ruleSet{layer: layer, exact: map[string][]int32{}, suffix: map[string][]int32{},
		v4: &trieNode{}, v6: &trieNode{}}
	for i, r := range rules {
		t, err := ParseTarget(r.Target)
		if err != nil {
			return nil, fmt.Errorf("%w: %s[%d]: %w", ErrInvalid, layer, i, err)
		}
		a := r.Action
		if forced != "" {
			a = forced
		}
		if a != Allow && a != Deny {
			return nil, fmt.Errorf("%w: %s[%d]: action %q is not allow or deny", ErrInvalid, layer, i, r.Action)
		}
		c := crule{action: a, target: t, ports: normalize(r.Ports), ref: fmt.Sprintf("%s[%d]", layer, i),
			line: r.Line, source: source, raw: r}
		if r.src != "" {
			c.source = r.src
		}
		if len(c.ports) == 1 && c.ports[0] == allPorts[0] {
			c.ports = nil
		}
		for _, p := range r.Protocols {
			c.protos |= protoBit(p)
		}
		if c.protos == protoTCP|protoUDP {
			c.protos = 0
		}
		c.desc = c.describe()
		s.restricted = s.restricted || c.restricted()
		s.rules = append(s.rules, c)
		idx := int32(i)
		switch t.Kind {
		case KindName:
			s.exact[t.Name] = append(s.exact[t.Name], idx)
		case KindWildcard:
			s.suffix[t.Name] = append(s.suffix[t.Name], idx)
		case KindAll:
			s.all = append(s.all, idx)
		case KindPrefix:
			root := s.v4
			if t.Prefix.Addr().Is6() {
				root = s.v6
			}
			root.insert(t.Prefix, idx)
		}
	}
	return s, nil
}

// firstIn returns the first index in list that covers port/proto and is below best, or
// best. skipAllowAll skips allow rules (catch-all allows never cover special addresses).
func (s *ruleSet) firstIn(list []int32, best int32, port uint16, proto Protocol, skipAllow bool) int32 {
	for _, i := range list {
		if best >= 0 && i >= best {
			return best
		}
		r := &s.rules[i]
		if skipAllow && r.action == Allow {
			continue
		}
		if r.covers(port, proto) {
			return i
		}
	}
	return best
}

// firstName returns the index of the first rule matching name at port/proto, or -1.
func (s *ruleSet) firstName(name string, port uint16, proto Protocol) int32 {
	best := int32(-1)
	if l, ok := s.exact[name]; ok {
		best = s.firstIn(l, best, port, proto, false)
	}
	if len(s.suffix) > 0 {
		for i := 0; i < len(name); i++ {
			if name[i] == '.' {
				if l, ok := s.suffix[name[i+1:]]; ok {
					best = s.firstIn(l, best, port, proto, false)
				}
			}
		}
	}
	return s.firstIn(s.all, best, port, proto, false)
}

// nameMatches returns every rule index matching name regardless of ports, ascending.
func (s *ruleSet) nameMatches(name string) []int32 {
	out := slices.Clone(s.exact[name])
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			out = append(out, s.suffix[name[i+1:]]...)
		}
	}
	out = append(out, s.all...)
	slices.Sort(out)
	return out
}

// firstAddr returns the first rule matching a at port/proto, or -1. With special set,
// catch-all allow rules are skipped; with prefixesOnly, catch-alls are skipped entirely.
func (s *ruleSet) firstAddr(a netip.Addr, port uint16, proto Protocol, special, prefixesOnly bool) int32 {
	root := s.v4
	if a.Is6() {
		root = s.v6
	}
	best := int32(-1)
	root.walk(a, func(l []int32) { best = s.firstIn(l, best, port, proto, false) })
	if prefixesOnly {
		return best
	}
	return s.firstIn(s.all, best, port, proto, special)
}

// addrMatches returns every rule index matching a regardless of ports, ascending.
func (s *ruleSet) addrMatches(a netip.Addr) []int32 {
	root := s.v4
	if a.Is6() {
		root = s.v6
	}
	var out []int32
	root.walk(a, func(l []int32) { out = append(out, l...) })
	out = append(out, s.all...)
	slices.Sort(out)
	return out
}

// trieNode is a binary trie over address bits; rules sit at their prefix's node.
type trieNode struct {
	child [2]*trieNode
	rules []int32
}

func (n *trieNode) insert(p netip.Prefix, idx int32) {
	b := p.Addr().AsSlice()
	for i := 0; i < p.Bits(); i++ {
		bit := (b[i/8] >> (7 - i%8)) & 1
		if n.child[bit] == nil {
			n.child[bit] = &trieNode{}
		}
		n = n.child[bit]
	}
	n.rules = append(n.rules, idx)
}

// walk calls fn with the rule list of every node on a's path (every prefix containing a).
func (n *trieNode) walk(a netip.Addr, fn func([]int32)) {
	var b [16]byte
	bits := 32
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
	} else {
		b, bits = a.As16(), 128
	}
	for i := 0; n != nil; i++ {
		if len(n.rules) > 0 {
			fn(n.rules)
		}
		if i == bits {
			return
		}
		n = n.child[(b[i/8]>>(7-i%8))&1]
	}
}

// DNSSettings are a policy's resolved DNS options (defaults applied).
type DNSSettings struct {
	// QueryTypes are the allowed query type names, sorted.
	QueryTypes            []string
	MaxLabelLength        int
	MaxNameLength         int
	MaxLabelEntropy       float64 // 0: off (dnsfilter's label score too)
	MinEntropyLabelLength int
	MaxQueriesPerMinute   int // 0: dnsfilter's default
	qtypes                map[uint16]bool
}

// DefaultQueryTypes are the query types allowed when a policy names none.
var DefaultQueryTypes = []string{"A", "AAAA", "CNAME", "HTTPS", "SVCB"}

func compileDNS(o *DNSOptions) DNSSettings {
	s := DNSSettings{MaxLabelLength: 63, MaxNameLength: 253, MaxLabelEntropy: 4.0, MinEntropyLabelLength: 24}
	types := DefaultQueryTypes
	if o != nil {
		if len(o.QueryTypes) > 0 {
			types = o.QueryTypes
		}
		if o.MaxLabelLength > 0 {
			s.MaxLabelLength = o.MaxLabelLength
		}
		if o.MaxNameLength > 0 {
			s.MaxNameLength = o.MaxNameLength
		}
		if g := o.TunnelGuard; g != nil {
			if g.MaxLabelEntropy != nil {
				s.MaxLabelEntropy = *g.MaxLabelEntropy
			}
			if g.MinLabelLength > 0 {
				s.MinEntropyLabelLength = g.MinLabelLength
			}
			s.MaxQueriesPerMinute = g.MaxQueriesPerMinute
		}
	}
	s.qtypes = map[uint16]bool{}
	for _, t := range types {
		t = strings.ToUpper(t)
		if n, ok := QTypeNumber(t); ok {
			s.qtypes[n] = true
			if !slices.Contains(s.QueryTypes, t) {
				s.QueryTypes = append(s.QueryTypes, t)
			}
		}
	}
	slices.Sort(s.QueryTypes)
	return s
}
