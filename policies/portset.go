package policies

import (
	"slices"
	"strings"
)

// PortSet is a set of (protocol, port) pairs: sorted, merged, non-overlapping ranges per
// protocol. It is what a name is allowed to reach, for programming learned addresses.
type PortSet struct {
	TCP []PortRange `json:"tcp,omitempty"`
	UDP []PortRange `json:"udp,omitempty"`
}

var allPorts = []PortRange{{1, 65535}}

// Empty reports whether the set has no port.
func (s PortSet) Empty() bool { return len(s.TCP) == 0 && len(s.UDP) == 0 }

// All reports whether the set holds every port of both protocols.
func (s PortSet) All() bool {
	return slices.Equal(s.TCP, allPorts) && slices.Equal(s.UDP, allPorts)
}

// Contains reports whether port/proto is in the set; proto "" means either protocol and
// port 0 any port.
func (s PortSet) Contains(port uint16, proto Protocol) bool {
	check := func(rs []PortRange) bool {
		if port == 0 {
			return len(rs) > 0
		}
		for _, r := range rs {
			if r.Contains(port) {
				return true
			}
		}
		return false
	}
	switch proto {
	case TCP:
		return check(s.TCP)
	case UDP:
		return check(s.UDP)
	}
	return check(s.TCP) || check(s.UDP)
}

// String is "all", "none" or "tcp:443,8000-8100 udp:53".
func (s PortSet) String() string {
	switch {
	case s.All():
		return "all"
	case s.Empty():
		return "none"
	}
	var parts []string
	for _, pr := range []struct {
		name string
		rs   []PortRange
	}{{"tcp", s.TCP}, {"udp", s.UDP}} {
		if len(pr.rs) == 0 {
			continue
		}
		ss := make([]string, len(pr.rs))
		for i, r := range pr.rs {
			ss[i] = r.String()
		}
		parts = append(parts, pr.name+":"+strings.Join(ss, ","))
	}
	return strings.Join(parts, " ")
}

// normalize sorts and merges ranges.
func normalize(rs []PortRange) []PortRange {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if uint32(r.First) <= uint32(last.Last)+1 {
			last.Last = max(last.Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// intersect returns a ∩ b for normalized lists.
func intersect(a, b []PortRange) []PortRange {
	var out []PortRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].First, b[j].First), min(a[i].Last, b[j].Last)
		if lo <= hi {
			out = append(out, PortRange{lo, hi})
		}
		if a[i].Last < b[j].Last {
			i++
		} else {
			j++
		}
	}
	return out
}

// subtract returns a − b for normalized lists.
func subtract(a, b []PortRange) []PortRange {
	var out []PortRange
	for _, r := range a {
		cur := []PortRange{r}
		for _, x := range b {
			var next []PortRange
			for _, c := range cur {
				if x.Last < c.First || x.First > c.Last {
					next = append(next, c)
					continue
				}
				if x.First > c.First {
					next = append(next, PortRange{c.First, x.First - 1})
				}
				if x.Last < c.Last {
					next = append(next, PortRange{x.Last + 1, c.Last})
				}
			}
			cur = next
		}
		out = append(out, cur...)
	}
	return out
}

func union(a, b []PortRange) []PortRange { return normalize(append(slices.Clone(a), b...)) }
