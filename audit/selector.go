package audit

import (
	"fmt"
	"slices"
	"strings"
)

// Kinds are the record kinds readers select by (airlock audit query --kind, the
// console), each the sources it stands for: control (control-plane calls), execd
// (agent actions), dns, flow (source bpf), http (gateway requests, ingress refusals,
// L7 and credential decisions), policy, and each source by its own name.
var Kinds = map[string][]Source{
	"control":    {SourceControl},
	"execd":      {SourceExecd},
	"dns":        {SourceDNS},
	"flow":       {SourceBPF},
	"bpf":        {SourceBPF},
	"http":       {SourceGateway, SourceIngress, SourceL7, SourceCredential},
	"gateway":    {SourceGateway},
	"ingress":    {SourceIngress},
	"l7":         {SourceL7},
	"credential": {SourceCredential},
	"policy":     {SourcePolicy},
}

// KindNames lists Kinds' names, sorted (for help and error texts).
func KindNames() []string {
	names := make([]string, 0, len(Kinds))
	for k := range Kinds {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Selector selects records by what Filter cannot see in a line cheaply: the principal,
// the command text and the kind. Zero fields select everything; set fields must all
// match. Match does no I/O.
type Selector struct {
	// Principal keeps records naming this principal id in extra.principal: the
	// control-plane calls it made and the agent actions it sent through execd.
	Principal string
	// Command keeps records whose command text contains it (case-sensitive): an execd
	// command's extra.command or code's extra.code, or the command line of a flow's
	// process (extra.process.cmdline, extra.cmdline) where a flow record carries one.
	Command string
	// Sources keeps records of these sources (from Kinds); empty keeps every source.
	Sources []Source
}

// ParseKinds turns kind names (Kinds; "flow,dns" split by the caller) into sources.
// An unknown name is an error naming the known ones.
func ParseKinds(names []string) ([]Source, error) {
	var out []Source
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" {
			continue
		}
		srcs, ok := Kinds[n]
		if !ok {
			return nil, fmt.Errorf("unknown kind %q (known: %s)", n, strings.Join(KindNames(), ", "))
		}
		for _, s := range srcs {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// Match reports whether r is selected.
func (s Selector) Match(r *Record) bool {
	if len(s.Sources) > 0 && !slices.Contains(s.Sources, r.Source) {
		return false
	}
	if s.Principal != "" {
		if p, _ := r.Extra["principal"].(string); p != s.Principal {
			return false
		}
	}
	if s.Command != "" && !slices.ContainsFunc(commandTexts(r), func(t string) bool { return strings.Contains(t, s.Command) }) {
		return false
	}
	return true
}

// commandTexts are the command texts of r (see Selector.Command).
func commandTexts(r *Record) []string {
	var out []string
	for _, k := range []string{"command", "code", "cmdline"} {
		if t, ok := r.Extra[k].(string); ok && t != "" {
			out = append(out, t)
		}
	}
	if p, ok := r.Extra["process"].(map[string]any); ok {
		for _, k := range []string{"cmdline", "cmd_line", "exe"} {
			if t, ok := p[k].(string); ok && t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}
