package policies

import (
	"fmt"
	"net/netip"
	"strings"
)

// TargetKind is what a rule target denotes.
type TargetKind uint8

// Target kinds.
const (
	// KindName is an exact domain name.
	KindName TargetKind = iota + 1
	// KindWildcard is "*.suffix": names strictly below suffix.
	KindWildcard
	// KindAll is "*" or "**": every name and address.
	KindAll
	// KindPrefix is an IP address or CIDR (an address is a /32 or /128 prefix).
	KindPrefix
)

// String names the kind.
func (k TargetKind) String() string {
	switch k {
	case KindName:
		return "name"
	case KindWildcard:
		return "wildcard"
	case KindAll:
		return "all"
	case KindPrefix:
		return "prefix"
	}
	return "invalid"
}

// Target is a parsed rule target.
type Target struct {
	Kind TargetKind
	// Name is the normalized name (KindName) or suffix without "*." (KindWildcard):
	// lower case, no trailing dot.
	Name string
	// Prefix is set for KindPrefix (masked, an address is a full-length prefix).
	Prefix netip.Prefix
}

// String returns the target's canonical form.
func (t Target) String() string {
	switch t.Kind {
	case KindName:
		return t.Name
	case KindWildcard:
		return "*." + t.Name
	case KindAll:
		return "*"
	case KindPrefix:
		if t.Prefix.IsSingleIP() {
			return t.Prefix.Addr().String()
		}
		return t.Prefix.String()
	}
	return ""
}

// ParseTarget parses a rule target (see Rule.Target) and returns it normalized. Errors
// say what is wrong for a human: bad CIDRs, misplaced wildcards, invalid names.
func ParseTarget(s string) (Target, error) {
	raw := s
	s = strings.TrimSpace(s)
	if s == "" {
		return Target{}, fmt.Errorf("target is empty")
	}
	if s == "*" || s == "**" {
		return Target{Kind: KindAll}, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Target{}, fmt.Errorf("invalid CIDR %q: %s", raw, cidrReason(s, err))
		}
		if p.Addr().Zone() != "" {
			return Target{}, fmt.Errorf("invalid CIDR %q: zones are not allowed", raw)
		}
		if p.Masked() != p {
			return Target{}, fmt.Errorf("invalid CIDR %q: host bits are set (did you mean %s?)", raw, p.Masked())
		}
		return Target{Kind: KindPrefix, Prefix: p}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return Target{}, fmt.Errorf("invalid address %q: zones are not allowed", raw)
		}
		return Target{Kind: KindPrefix, Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	} else if strings.Contains(s, ":") {
		return Target{}, fmt.Errorf("invalid IPv6 address %q", raw)
	}
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if looksNumeric(name) {
		return Target{}, fmt.Errorf("invalid IPv4 address %q", raw)
	}
	kind := KindName
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		kind, name = KindWildcard, rest
	}
	if strings.Contains(name, "*") {
		return Target{}, fmt.Errorf("invalid wildcard %q: \"*\" is allowed only as the whole first label (\"*.example.com\") or alone (\"*\")", raw)
	}
	if err := checkName(name, 63, 253); err != nil {
		return Target{}, fmt.Errorf("invalid name %q: %w", raw, err)
	}
	return Target{Kind: kind, Name: name}, nil
}

// checkName validates a normalized domain name: labels of letters, digits, '-' and '_',
// not starting or ending with '-', within the label and name length limits.
func checkName(name string, maxLabel, maxName int) error {
	if name == "" {
		return fmt.Errorf("empty name")
	}
	if len(name) > maxName {
		return fmt.Errorf("name is %d characters long (limit %d)", len(name), maxName)
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return fmt.Errorf("empty label")
		}
		if len(label) > maxLabel {
			return fmt.Errorf("label %q is %d characters long (limit %d)", label, len(label), maxLabel)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("label %q has the character %q", label, rune(c))
			}
		}
	}
	return nil
}

// NormalizeName lower-cases a query name and strips its trailing dot.
func NormalizeName(name string) string {
	name = strings.TrimSuffix(name, ".")
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(name)
		}
	}
	return name
}

// looksNumeric reports whether every label is digits, i.e. a malformed IPv4 address such
// as 10.0.0.256 or 10.1.
func looksNumeric(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			if label[i] < '0' || label[i] > '9' {
				return false
			}
		}
	}
	return true
}

func cidrReason(s string, err error) string {
	addr, bits, _ := strings.Cut(s, "/")
	if _, aerr := netip.ParseAddr(addr); aerr != nil {
		return "the address part is not an IP address"
	}
	if bits == "" {
		return "missing prefix length"
	}
	if strings.Contains(err.Error(), "out of range") || strings.Contains(err.Error(), "bad bits") {
		return "prefix length out of range"
	}
	return err.Error()
}
