package policies

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
)

// Dump writes a deterministic, human-readable listing of the compiled policy: settings,
// then each layer's indexes (exact names, wildcard suffixes, catch-alls, prefixes). The
// golden-file tests compare it, and `airlock policy explain --dump` prints it.
func (d *Decider) Dump(w io.Writer) {
	fmt.Fprintf(w, "policy name=%q revision=%d mode=%s default=%s l7=%s audit=%s ipv6=%t\n",
		d.policy.Name, d.version, d.mode, d.def, d.l7, d.audit, d.hasV6)
	s := d.dns
	fmt.Fprintf(w, "dns queryTypes=%s maxLabelLength=%d maxNameLength=%d maxLabelEntropy=%.2f minEntropyLabelLength=%d maxQueriesPerMinute=%d\n",
		strings.Join(s.QueryTypes, ","), s.MaxLabelLength, s.MaxNameLength, s.MaxLabelEntropy, s.MinEntropyLabelLength, s.MaxQueriesPerMinute)
	for _, set := range []*ruleSet{d.deny, d.allow, d.rules} {
		set.dump(w)
	}
	fmt.Fprintf(w, "ip-rules %d\n", len(d.ipRules))
	for _, r := range d.ipRules {
		mode := ""
		if r.Audit {
			mode = " mode=audit"
		}
		fmt.Fprintf(w, "  %s %s ports=%s protocols=%s catchAll=%t %s%s\n", r.Prefix, r.Action,
			joinPorts(r.Ports), joinProtos(r.Protocols), r.CatchAll, r.Rule, mode)
	}
}

func (s *ruleSet) dump(w io.Writer) {
	fmt.Fprintf(w, "layer %s rules=%d\n", s.layer, len(s.rules))
	refs := func(l []int32) string {
		out := make([]string, len(l))
		for i, idx := range l {
			r := &s.rules[idx]
			out[i] = fmt.Sprintf("%d:%s[%s]", idx, r.action, r.scope())
		}
		return strings.Join(out, " ")
	}
	for _, k := range sortedKeys(s.exact) {
		fmt.Fprintf(w, "  exact %s -> %s\n", k, refs(s.exact[k]))
	}
	for _, k := range sortedKeys(s.suffix) {
		fmt.Fprintf(w, "  suffix *.%s -> %s\n", k, refs(s.suffix[k]))
	}
	if len(s.all) > 0 {
		fmt.Fprintf(w, "  all -> %s\n", refs(s.all))
	}
	var prefixes []string
	for i := range s.rules {
		if s.rules[i].target.Kind == KindPrefix {
			prefixes = append(prefixes, fmt.Sprintf("  prefix %s -> %s", s.rules[i].target.Prefix, refs([]int32{int32(i)})))
		}
	}
	slices.SortStableFunc(prefixes, func(a, b string) int {
		pa, _ := netip.ParsePrefix(strings.Fields(a)[1])
		pb, _ := netip.ParsePrefix(strings.Fields(b)[1])
		if c := pa.Addr().Compare(pb.Addr()); c != 0 {
			return c
		}
		return pa.Bits() - pb.Bits()
	})
	for _, p := range prefixes {
		fmt.Fprintln(w, p)
	}
	for i := range s.rules {
		if h := s.rules[i].http; h != nil {
			h.dump(w)
		}
	}
}

func sortedKeys(m map[string][]int32) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func joinPorts(ps []PortRange) string {
	if len(ps) == 0 {
		return "all"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

func joinProtos(ps []Protocol) string {
	if len(ps) == 0 {
		return "all"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return strings.Join(out, ",")
}
