package propose

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/policies"
)

// proposed is one rule of a proposal with its report.
type proposed struct {
	rule   policies.Rule
	report RuleReport
}

// rulesFor spells out the rules that allow what d saw: one rule with HTTP rules for
// the ports whose requests were checked (80, 443), and one per protocol for the other
// ports (none known: every port, as for a name only ever asked in DNS).
func rulesFor(d *dest, minPaths int) []proposed {
	httpPorts := map[uint16]bool{}
	for k := range d.reqs {
		if k.port == 80 || k.port == 443 {
			httpPorts[k.port] = true
		}
	}
	var out []proposed
	if len(httpPorts) > 0 {
		r := policies.Rule{Action: policies.Allow, Target: d.target, Protocols: []policies.Protocol{policies.TCP},
			HTTP: &policies.HTTPRules{Default: policies.Deny}}
		var c Count
		for _, p := range slices.Sorted(maps.Keys(httpPorts)) {
			r.Ports = append(r.Ports, policies.PortRange{First: p, Last: p})
			c.merge(d.ports[portKey{p, policies.TCP}])
		}
		var reports []HTTPReport
		r.HTTP.Rules, reports = httpRules(d, httpPorts, minPaths)
		out = append(out, proposed{r, RuleReport{Target: d.target, Scope: scope(r), Members: d.members, Count: c, New: true, HTTP: reports}})
	}
	byProto := map[policies.Protocol][]uint16{}
	counts := map[policies.Protocol]Count{}
	for k, c := range d.ports {
		if k.proto == policies.TCP && httpPorts[k.port] {
			continue
		}
		byProto[k.proto] = append(byProto[k.proto], k.port)
		x := counts[k.proto]
		x.merge(c)
		counts[k.proto] = x
	}
	if len(out) == 0 && len(byProto) == 0 {
		r := policies.Rule{Action: policies.Allow, Target: d.target}
		return []proposed{{r, RuleReport{Target: d.target, Scope: scope(r), Members: d.members, Count: d.count, New: true}}}
	}
	for _, proto := range slices.Sorted(maps.Keys(byProto)) {
		ports := byProto[proto]
		slices.Sort(ports)
		r := policies.Rule{Action: policies.Allow, Target: d.target}
		for _, p := range slices.Compact(ports) {
			r.Ports = append(r.Ports, policies.PortRange{First: p, Last: p})
		}
		if proto != "" {
			r.Protocols = []policies.Protocol{proto}
		}
		c := counts[proto]
		if len(out) == 0 && len(byProto) == 1 {
			c = d.count // the only rule: DNS answers count for it too
		}
		out = append(out, proposed{r, RuleReport{Target: d.target, Scope: scope(r), Members: d.members, Count: c, New: true}})
	}
	return out
}

// httpRules proposes allow rules for the requests d saw on httpPorts: per first path
// segment, a prefix "/seg/*" once minPaths distinct paths below it were seen, else the
// exact paths; each with the methods seen there. Ordered by path.
func httpRules(d *dest, httpPorts map[uint16]bool, minPaths int) ([]policies.HTTPRule, []HTTPReport) {
	type agg struct {
		methods map[string]bool
		count   Count
	}
	bySeg := map[string]map[string]*agg{} // first segment -> path -> methods
	for k, c := range d.reqs {
		if !httpPorts[k.port] {
			continue
		}
		seg := ""
		if rest := strings.TrimPrefix(k.path, "/"); strings.Contains(rest, "/") {
			seg, _, _ = strings.Cut(rest, "/")
		}
		if bySeg[seg] == nil {
			bySeg[seg] = map[string]*agg{}
		}
		a := bySeg[seg][k.path]
		if a == nil {
			a = &agg{methods: map[string]bool{}}
			bySeg[seg][k.path] = a
		}
		a.methods[k.method] = true
		a.count.merge(c)
	}
	patterns := map[string]*agg{}
	for seg, paths := range bySeg {
		if seg != "" && minPaths > 0 && len(paths) >= minPaths {
			p := &agg{methods: map[string]bool{}}
			for _, a := range paths {
				maps.Copy(p.methods, a.methods)
				p.count.merge(a.count)
			}
			patterns["/"+seg+"/*"] = p
			continue
		}
		maps.Copy(patterns, paths)
	}
	var rules []policies.HTTPRule
	var reports []HTTPReport
	for _, path := range slices.Sorted(maps.Keys(patterns)) {
		a := patterns[path]
		methods := slices.Sorted(maps.Keys(a.methods))
		rules = append(rules, policies.HTTPRule{Action: policies.Allow, Methods: methods, Path: path})
		reports = append(reports, HTTPReport{Methods: methods, Path: path, Count: a.count})
	}
	return rules, reports
}

// extend makes res the base plus a rule, first, for each destination of dests the base
// does not allow entirely. A host the base decides with HTTP rules keeps them, after
// the proposed ones; a base deny rule with the same target and an overlapping scope is
// dropped (the parser would refuse it as shadowed).
func extend(res *Result, base *policies.Policy, floor *policies.Overlay, dests []*dest, minPaths int) error {
	bd, err := policies.Compile(base, policies.CompileOptions{Overlay: floor})
	if err != nil {
		return fmt.Errorf("base policy: %w", err)
	}
	out := base.Clone()
	var add []policies.Rule
	var kept []RuleReport
	for _, d := range dests {
		if rule, ok := covered(bd, d); ok {
			kept = append(kept, RuleReport{Rule: rule + " of the base", Target: d.target, Members: d.members, Count: d.count})
			continue
		}
		for _, p := range rulesFor(d, minPaths) {
			if p.rule.HTTP != nil {
				if h := baseHTTP(bd, base, d); h != nil {
					p.rule.HTTP.Rules = append(p.rule.HTTP.Rules, h.Rules...)
					p.rule.HTTP.Access, p.rule.HTTP.Git, p.rule.HTTP.MaxBody = h.Access, h.Git, h.MaxBody
					p.rule.HTTP.Default = cmp.Or(h.Default, policies.Deny)
				}
			}
			add = append(add, p.rule)
			res.Rules = append(res.Rules, p.report)
		}
	}
	kept2 := out.Egress[:0]
	for _, r := range out.Egress {
		if r.Action == policies.Deny && slices.ContainsFunc(add, func(a policies.Rule) bool { return sameTarget(a, r) && policies.ScopesOverlap(a, r) }) {
			continue
		}
		kept2 = append(kept2, r)
	}
	out.Egress = append(add, kept2...)
	res.Policy = out
	res.Rules = append(res.Rules, kept...)
	return nil
}

// covered reports whether bd allows everything d saw, and the rule that decides d.
func covered(bd *policies.Decider, d *dest) (string, bool) {
	ok := func(dec policies.Decision) bool { return dec.Allowed() && !dec.WouldDeny }
	if d.addr.IsValid() {
		dec := bd.DecideAddr(d.addr, 0, "")
		for k := range d.ports {
			if dec = bd.DecideAddr(d.addr, k.port, k.proto); !ok(dec) {
				return "", false
			}
		}
		return dec.Rule, len(d.ports) > 0 || ok(dec)
	}
	names := d.members
	if len(names) == 0 {
		names = []string{d.target}
	}
	rule := ""
	for _, n := range names {
		dec := bd.DecideName(n, 0, "")
		if !ok(dec) {
			return "", false
		}
		rule = dec.Rule
		for k := range d.ports {
			if !ok(bd.DecideName(n, k.port, k.proto)) {
				return "", false
			}
		}
		for k := range d.reqs {
			dec := bd.DecideName(n, k.port, policies.TCP)
			if !ok(dec) {
				return "", false
			}
			if dec.HTTP != nil && !ok(dec.HTTP.Decide(policies.HTTPRequest{Method: k.method, EscapedPath: (&url.URL{Path: k.path}).EscapedPath()})) {
				return "", false
			}
		}
	}
	return rule, true
}

// baseHTTP returns the HTTP rules of the base rule that allows d's host, if any.
func baseHTTP(bd *policies.Decider, base *policies.Policy, d *dest) *policies.HTTPRules {
	name := d.target
	if len(d.members) > 0 {
		name = d.members[0]
	}
	dec := bd.DecideName(name, 443, policies.TCP)
	if dec.HTTP == nil {
		dec = bd.DecideName(name, 80, policies.TCP)
	}
	var i int
	if dec.HTTP == nil {
		return nil
	}
	if _, err := fmt.Sscanf(dec.Rule, "egress[%d]", &i); err != nil || i < 0 || i >= len(base.Egress) {
		return nil
	}
	return base.Egress[i].HTTP
}

func sameTarget(a, b policies.Rule) bool {
	ta, ea := policies.ParseTarget(a.Target)
	tb, eb := policies.ParseTarget(b.Target)
	return ea == nil && eb == nil && ta.String() == tb.String()
}
