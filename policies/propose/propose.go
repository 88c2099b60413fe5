// Package propose turns what a sandbox did, as its audit records show (package audit),
// into a minimal egress policy that would have allowed exactly that: the names and
// addresses it reached or tried (allowed, denied or would-deny alike), the ports and
// protocols it used, and for hosts whose requests were checked one by one (HTTP rules)
// the methods and paths, generalised a little (sibling names into a wildcard, paths
// into a prefix of their first segment). With a base policy the proposal is the base
// plus what it lacks. Destinations in the platform floor (the operator overlay's
// always-deny list) are never proposed: no policy rule could allow them.
//
// It backs `airlock policy propose` and the console's pending proposals; `airlock
// policy test` (package replay) replays a proposal against the same records.
package propose

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// Defaults of Options.
const (
	// DefaultMinSiblings is how many distinct names under one parent become a
	// wildcard for that parent.
	DefaultMinSiblings = 3
	// DefaultMinPaths is how many distinct paths under one first segment become a
	// prefix rule for that segment.
	DefaultMinPaths = 2
)

// Options tune a proposal.
type Options struct {
	// MinSiblings: exact names under one parent of at least two labels
	// (a.example.com, b.example.com, ...) become "*.example.com" when at least this
	// many distinct ones were seen. 0 means DefaultMinSiblings; negative never.
	MinSiblings int
	// MinPaths: requests to one host whose paths share a first segment ("/repos/a",
	// "/repos/b") become the prefix "/repos/*" when at least this many distinct paths
	// were seen; fewer stay exact. 0 means DefaultMinPaths; negative never.
	MinPaths int
	// Floor is the operator overlay the sandbox runs under (policies.BaseOverlay plus
	// the host's addresses and the operator's deny list); what its always-deny list
	// refuses is never proposed. Nil means policies.BaseOverlay().
	Floor *policies.Overlay
	// Base, when set, is the policy the proposal extends: the result is Base with a
	// rule, placed first, for each destination Base did not allow; a deny rule of Base
	// for the same target and scope is dropped (it would conflict). Nil: a minimal
	// policy of its own (default deny).
	Base *policies.Policy
	// Name labels the proposed policy (Policy.Name) when Base is nil.
	Name string
}

// HTTPReport is one proposed HTTP rule and the requests it covers.
type HTTPReport struct {
	Methods []string `json:"methods"`
	Path    string   `json:"path"`
	Count
}

// RuleReport is one rule of the proposal and what it covers.
type RuleReport struct {
	// Rule is its reference in the proposed policy ("egress[0]").
	Rule   string `json:"rule"`
	Target string `json:"target"`
	// Scope is the rule's ports and protocols ("tcp:80,443", or "all").
	Scope string `json:"scope"`
	// Members are the names a proposed wildcard stands for.
	Members []string `json:"members,omitempty"`
	Count
	// New is true for a rule the proposal adds (always, without a base).
	New  bool         `json:"new"`
	HTTP []HTTPReport `json:"http,omitempty"`
}

// Skipped is a destination seen in the records that the proposal does not allow, with
// why: the platform floor, or a request no rule can match.
type Skipped struct {
	Target string `json:"target"`
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}

// Result is a proposal.
type Result struct {
	// Policy is the proposed policy (valid: it parses and compiles).
	Policy *policies.Policy `json:"policy"`
	// Rules describes each rule of Policy the records account for, in policy order.
	Rules []RuleReport `json:"rules"`
	// Skipped lists what was seen and is not proposed.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Records is how many records were read, Used how many were DNS answers, flows or
	// L7 decisions of the sandbox.
	Records int `json:"records"`
	Used    int `json:"used"`
}

// Propose builds the proposal for recs, the records of one sandbox in log order
// (audit.Query with a SandboxID filter). It fails only when the proposal does not
// compile (a bug) or the base is invalid.
func Propose(recs []audit.Record, opts Options) (*Result, error) {
	if opts.Floor == nil {
		opts.Floor = policies.BaseOverlay()
	}
	floor, err := policies.Compile(&policies.Policy{DefaultAction: policies.Allow, Egress: []policies.Rule{}},
		policies.CompileOptions{Overlay: opts.Floor})
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	o := observe(recs)
	res := &Result{Records: len(recs), Used: o.used, Rules: []RuleReport{}}
	var dests []*dest
	for _, d := range o.names {
		if dec := floor.DecideName(d.target, 0, ""); dec.InFloor() {
			o.skip(d.target, "platform floor: "+dec.Rule+" ("+dec.Reason+")")
			continue
		}
		dests = append(dests, d)
	}
	dests = generalise(dests, cmp.Or(opts.MinSiblings, DefaultMinSiblings))
	for _, d := range o.addrs {
		if dec := floor.DecideAddr(d.addr, 0, ""); dec.InFloor() {
			o.skip(d.target, "platform floor: "+dec.Rule+" ("+dec.Reason+")")
			continue
		}
		dests = append(dests, d)
	}
	slices.SortFunc(dests, func(a, b *dest) int { return cmp.Compare(a.first, b.first) })
	minPaths := cmp.Or(opts.MinPaths, DefaultMinPaths)
	if opts.Base == nil {
		res.Policy = &policies.Policy{Name: opts.Name, DefaultAction: policies.Deny, Egress: []policies.Rule{}}
		for _, d := range dests {
			for _, rr := range rulesFor(d, minPaths) {
				res.Rules = append(res.Rules, rr.report)
				res.Policy.Egress = append(res.Policy.Egress, rr.rule)
			}
		}
	} else if err := extend(res, opts.Base, opts.Floor, dests, minPaths); err != nil {
		return nil, err
	}
	for i := range res.Rules {
		res.Rules[i].Rule = fmt.Sprintf("egress[%d]", ruleIndex(res.Policy, res.Rules[i]))
	}
	for _, k := range o.order {
		res.Skipped = append(res.Skipped, *o.skipped[k])
	}
	// The proposal must be what the parser accepts: round-trip it.
	if _, err := policies.Compile(res.Policy, policies.CompileOptions{Overlay: opts.Floor}); err != nil {
		return nil, fmt.Errorf("proposal does not compile: %w", err)
	}
	return res, nil
}

// ruleIndex finds the position of the rule r reports on in p (target and scope).
func ruleIndex(p *policies.Policy, r RuleReport) int {
	for i, e := range p.Egress {
		if e.Target == r.Target && scope(e) == r.Scope && e.Action == policies.Allow {
			return i
		}
	}
	return -1
}

// generalise merges exact names under one parent of two labels or more into a
// wildcard once min distinct ones were seen.
func generalise(dests []*dest, min int) []*dest {
	if min <= 0 {
		return dests
	}
	byParent := map[string][]*dest{}
	for _, d := range dests {
		if _, parent, ok := strings.Cut(d.target, "."); ok && strings.Contains(parent, ".") {
			byParent[parent] = append(byParent[parent], d)
		}
	}
	merged := map[*dest]bool{}
	var out []*dest
	for _, parent := range slices.Sorted(maps.Keys(byParent)) {
		group := byParent[parent]
		if len(group) < min {
			continue
		}
		w := newDest("*."+parent, group[0].first)
		for _, d := range group {
			w.first = min2(w.first, d.first)
			w.members = append(w.members, d.target)
			w.count.merge(d.count)
			for k, c := range d.ports {
				x := w.ports[k]
				x.merge(c)
				w.ports[k] = x
			}
			for k, c := range d.reqs {
				x := w.reqs[k]
				x.merge(c)
				w.reqs[k] = x
			}
			merged[d] = true
		}
		slices.Sort(w.members)
		out = append(out, w)
	}
	for _, d := range dests {
		if !merged[d] {
			out = append(out, d)
		}
	}
	return out
}

func min2(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// scope spells a rule's ports and protocols as RuleReport.Scope does.
func scope(r policies.Rule) string {
	if len(r.Ports) == 0 && len(r.Protocols) == 0 {
		return "all"
	}
	protos := "tcp,udp"
	if len(r.Protocols) > 0 {
		ps := make([]string, len(r.Protocols))
		for i, p := range r.Protocols {
			ps[i] = string(p)
		}
		protos = strings.Join(ps, ",")
	}
	ports := "all"
	if len(r.Ports) > 0 {
		ps := make([]string, len(r.Ports))
		for i, p := range r.Ports {
			ps[i] = p.String()
		}
		ports = strings.Join(ps, ",")
	}
	return protos + ":" + ports
}
