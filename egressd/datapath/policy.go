package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Limits shared by both backends.
const (
	MaxIDLen         = 64
	MaxAddrsPerFam   = 4
	MaxRulesPerAddr  = 16
	MaxPrefixes      = 4096
	MaxLearnedPerSbx = 16384
	// MaxLearnedGrants bounds the live grants of one learned address (Learn).
	MaxLearnedGrants = 16
)

// ValidateSpec checks spec and returns it normalised (addresses unmapped, prefixes
// masked). Errors wrap ErrInvalidSpec.
func ValidateSpec(spec Spec) (Spec, error) {
	if spec.ID == "" || len(spec.ID) > MaxIDLen {
		return spec, fmt.Errorf("%w: sandbox id must be 1 to %d bytes", ErrInvalidSpec, MaxIDLen)
	}
	if spec.HostIfindex <= 0 || spec.HostIfname == "" {
		return spec, fmt.Errorf("%w: sandbox %s: host interface index and name are required", ErrInvalidSpec, spec.ID)
	}
	var n4, n6 int
	addrs := make([]netip.Addr, 0, len(spec.Addrs))
	for _, a := range spec.Addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() {
			return spec, fmt.Errorf("%w: sandbox %s: invalid address %v", ErrInvalidSpec, spec.ID, a)
		}
		if a.Is4() {
			n4++
		} else {
			n6++
		}
		addrs = append(addrs, a)
	}
	if n4 > MaxAddrsPerFam || n6 > MaxAddrsPerFam {
		return spec, fmt.Errorf("%w: sandbox %s: at most %d addresses per family", ErrInvalidSpec, spec.ID, MaxAddrsPerFam)
	}
	if len(addrs) == 0 {
		return spec, fmt.Errorf("%w: sandbox %s: no sandbox address", ErrInvalidSpec, spec.ID)
	}
	spec.Addrs = addrs
	var r4, r6 int
	res := make([]netip.Addr, 0, len(spec.Resolvers))
	for _, a := range spec.Resolvers {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() {
			return spec, fmt.Errorf("%w: sandbox %s: invalid resolver %v", ErrInvalidSpec, spec.ID, a)
		}
		if a.Is4() {
			r4++
		} else {
			r6++
		}
		res = append(res, a)
	}
	if r4 > 1 || r6 > 1 {
		return spec, fmt.Errorf("%w: sandbox %s: at most one resolver per family", ErrInvalidSpec, spec.ID)
	}
	spec.Resolvers = res
	p, err := ValidatePolicy(spec.Policy)
	if err != nil {
		return spec, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	spec.Policy = p
	return spec, nil
}

// ValidatePolicy checks p and returns it normalised. Errors wrap ErrInvalidSpec.
func ValidatePolicy(p Policy) (Policy, error) {
	if p.Default != ActionAllow && p.Default != ActionDeny {
		return p, fmt.Errorf("%w: default action %d", ErrInvalidSpec, p.Default)
	}
	if p.IPv6 != IPv6Block && p.IPv6 != IPv6Filter {
		return p, fmt.Errorf("%w: ipv6 mode %d", ErrInvalidSpec, p.IPv6)
	}
	rules := make([]Rule, len(p.Rules))
	for i, r := range p.Rules {
		if !r.Prefix.IsValid() {
			return p, fmt.Errorf("%w: rule %d: invalid prefix", ErrInvalidSpec, i)
		}
		if r.Prefix.Addr().Is4In6() {
			bits := r.Prefix.Bits() - 96
			if bits < 0 {
				return p, fmt.Errorf("%w: rule %d: IPv4-mapped prefix %s shorter than /96", ErrInvalidSpec, i, r.Prefix)
			}
			r.Prefix = netip.PrefixFrom(r.Prefix.Addr().Unmap(), bits)
		}
		r.Prefix = r.Prefix.Masked()
		if r.Action != ActionAllow && r.Action != ActionDeny && r.Action != ActionDenyAlways && r.Action != ActionDenyAudit {
			return p, fmt.Errorf("%w: rule %d: action %d", ErrInvalidSpec, i, r.Action)
		}
		if !r.Ports.All() {
			if r.Ports.First > r.Ports.Last {
				return p, fmt.Errorf("%w: rule %d: port range %d-%d", ErrInvalidSpec, i, r.Ports.First, r.Ports.Last)
			}
			if r.Proto != ProtoAny && r.Proto != ProtoTCP && r.Proto != ProtoUDP {
				return p, fmt.Errorf("%w: rule %d: ports need tcp, udp or any protocol", ErrInvalidSpec, i)
			}
		} else {
			r.Ports = PortRange{}
		}
		rules[i] = r
	}
	p.Rules = rules
	if _, err := CompilePrefixes(rules); err != nil {
		return p, err
	}
	return p, nil
}

// PrefixRules is one entry of the compiled longest-prefix-match table: the rules that
// apply to every address whose longest matching prefix is Prefix, in policy order.
type PrefixRules struct {
	Prefix netip.Prefix
	Rules  []Rule
}

// CompilePrefixes turns ordered rules into a longest-prefix-match table: for each
// distinct prefix P, the rules whose prefix contains P, in their original order. The
// addresses inside P but inside no longer prefix see exactly the rules that contain
// them, so "longest match, then first matching rule in the list" equals "first
// matching rule of the policy". Errors wrap ErrInvalidSpec when a prefix collects more
// than MaxRulesPerAddr rules or the table exceeds MaxPrefixes per family.
func CompilePrefixes(rules []Rule) ([]PrefixRules, error) {
	seen := map[netip.Prefix]bool{}
	var out []PrefixRules
	n4, n6 := 0, 0
	for _, r := range rules {
		if seen[r.Prefix] {
			continue
		}
		seen[r.Prefix] = true
		pr := PrefixRules{Prefix: r.Prefix}
		for _, o := range rules {
			if o.Prefix.Addr().Is4() == r.Prefix.Addr().Is4() && o.Prefix.Bits() <= r.Prefix.Bits() && o.Prefix.Contains(r.Prefix.Addr()) {
				pr.Rules = append(pr.Rules, o)
			}
		}
		if len(pr.Rules) > MaxRulesPerAddr {
			return nil, fmt.Errorf("%w: %d rules cover %s (at most %d)", ErrInvalidSpec, len(pr.Rules), r.Prefix, MaxRulesPerAddr)
		}
		if r.Prefix.Addr().Is4() {
			n4++
		} else {
			n6++
		}
		out = append(out, pr)
	}
	if n4 > MaxPrefixes || n6 > MaxPrefixes {
		return nil, fmt.Errorf("%w: more than %d prefixes per family", ErrInvalidSpec, MaxPrefixes)
	}
	slices.SortFunc(out, func(a, b PrefixRules) int { return a.Prefix.Bits() - b.Prefix.Bits() })
	return out, nil
}

// Match returns the first static rule matching a packet to dst (unmapped) with proto
// and destination port, and whether one matched. frag marks a non-first fragment,
// which has no port and matches on prefix and protocol alone.
func Match(rules []Rule, dst netip.Addr, proto Proto, port uint16, frag bool) (Rule, bool) {
	dst = dst.Unmap()
	for _, r := range rules {
		if !r.Prefix.Contains(dst) {
			continue
		}
		if r.Proto != ProtoAny && r.Proto != proto {
			continue
		}
		lo, hi := r.Ports.Bounds()
		if !frag && (port < lo || port > hi) {
			continue
		}
		return r, true
	}
	return Rule{}, false
}

// ValidateLearn checks the arguments of Datapath.Learn, the same for every backend: addr
// (IPv4-mapped addresses unmapped) must be valid and ttl positive; ports are
// ValidateGrants's, with none meaning []ProtoPorts{EveryPort}. Errors wrap
// ErrInvalidSpec.
func ValidateLearn(addr netip.Addr, ports []ProtoPorts, ttl time.Duration) (netip.Addr, []ProtoPorts, error) {
	addr = addr.Unmap()
	if !addr.IsValid() || ttl <= 0 {
		return addr, nil, fmt.Errorf("%w: learn %v ttl %v", ErrInvalidSpec, addr, ttl)
	}
	grants, err := ValidateGrants(ports)
	if err != nil {
		return addr, nil, err
	}
	if grants == nil {
		grants = []ProtoPorts{EveryPort}
	}
	return addr, grants, nil
}

// ValidateGrants checks Learn's ports and returns them normalised (ranges expanded,
// duplicates dropped), nil meaning every port. Errors wrap ErrInvalidSpec.
func ValidateGrants(ports []ProtoPorts) ([]ProtoPorts, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	out := make([]ProtoPorts, 0, len(ports))
	for _, g := range ports {
		if g.Proto != ProtoTCP && g.Proto != ProtoUDP {
			return nil, fmt.Errorf("%w: learned grant protocol %s: want tcp or udp", ErrInvalidSpec, g.Proto)
		}
		lo, hi := g.Ports.Bounds()
		if lo > hi {
			return nil, fmt.Errorf("%w: learned grant port range %d-%d", ErrInvalidSpec, lo, hi)
		}
		g.Ports = PortRange{First: lo, Last: hi}
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	if len(out) > MaxLearnedGrants {
		return nil, fmt.Errorf("%w: %d learned grants, at most %d", ErrInvalidSpec, len(out), MaxLearnedGrants)
	}
	return out, nil
}

// GrantsAllow reports whether live grants (nil: none; a grant with every port of
// ProtoAny: every port) allow proto/port; frag (a non-first fragment) ignores ports.
func GrantsAllow(grants []ProtoPorts, proto Proto, port uint16, frag bool) bool {
	for _, g := range grants {
		if g.Proto != ProtoAny && g.Proto != proto {
			continue
		}
		lo, hi := g.Ports.Bounds()
		if frag || (port >= lo && port <= hi) {
			return true
		}
	}
	return false
}

// EveryPort is the grant of an address learned without ports.
var EveryPort = ProtoPorts{Proto: ProtoAny}

// Allows reports whether a new outbound flow to dst:port would be allowed by p's
// static rules, a live learned grant (learned: the grants of dst's live entries for
// this proto/port, see GrantsAllow) or the default, ignoring DNS, DoT and L7 handling.
// Backends use it to cut established flows after Update or Forget.
func Allows(p Policy, dst netip.Addr, proto Proto, port uint16, learned bool) bool {
	if dst.Unmap().Is6() && p.IPv6 == IPv6Block {
		return false
	}
	if r, ok := Match(p.Rules, dst, proto, port, false); ok {
		return r.Action == ActionAllow || r.Action == ActionDenyAudit
	}
	return learned || p.Default == ActionAllow
}
