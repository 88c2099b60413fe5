package policies

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// OpenSandbox egress API helpers (docs/spec/egress-api.yaml, NOTES.md
// "Egress API"): the {defaultAction, egress} shape, PATCH merge and DELETE by target.
// Lifecycle and egressd serve GET/PATCH/DELETE /policy with these and Parse, so the CLI,
// lifecycle and egressd validate identically.

// NetworkRule is OpenSandbox's NetworkRule: {action, target}.
type NetworkRule struct {
	Action Action `json:"action"`
	Target string `json:"target"`
}

// NetworkPolicy is OpenSandbox's NetworkPolicy: {defaultAction, egress}.
type NetworkPolicy struct {
	DefaultAction Action        `json:"defaultAction,omitempty"`
	Egress        []NetworkRule `json:"egress"`
}

// PolicyStatus is the body of GET, PATCH and DELETE /policy answers
// (PolicyStatusResponse).
type PolicyStatus struct {
	Status string `json:"status"`
	// Mode is derived from the default action: "deny_all" or "allow_all".
	Mode string `json:"mode"`
	// EnforcementMode names the backend: "ebpf", "nftables" or "dns".
	EnforcementMode string `json:"enforcementMode"`
	// PolicyMode is the policy's enforcement mode, an Airlock extension: "enforce" or
	// "audit" (what the policy would deny passes and is audited as would_deny).
	PolicyMode string         `json:"policyMode,omitempty"`
	Reason     string         `json:"reason,omitempty"`
	Policy     *NetworkPolicy `json:"policy,omitempty"`
}

// ToNetworkPolicy returns p in the OpenSandbox shape. Airlock extensions (ports,
// protocols, DNS options, mode, ...) have no place there: lossless is false when p uses
// any, so callers that must round-trip store the Airlock JSON (json.Marshal(p)) instead.
func ToNetworkPolicy(p *Policy) (np NetworkPolicy, lossless bool) {
	np = NetworkPolicy{DefaultAction: p.EffectiveDefault(), Egress: make([]NetworkRule, 0, len(p.Egress))}
	lossless = p.Version == 0 && p.Name == "" && p.Mode == "" && p.DNS == nil && p.L7 == "" && p.Audit == ""
	for _, r := range p.Egress {
		np.Egress = append(np.Egress, NetworkRule{Action: r.Action, Target: r.Target})
		lossless = lossless && len(r.Ports) == 0 && len(r.Protocols) == 0 && r.Comment == "" && r.HTTP == nil && r.Mode == ""
	}
	return np, lossless
}

// FromNetworkPolicy returns the Policy with the same meaning as np, validated like Parse
// (source names it in errors).
func FromNetworkPolicy(source string, np NetworkPolicy) (*Policy, error) {
	b, err := json.Marshal(np)
	if err != nil {
		return nil, err
	}
	return Parse(source, b)
}

// Status returns the /policy answer for p (nil p: no policy, allow-all per the spec).
func Status(p *Policy, enforcementMode string) PolicyStatus {
	if p == nil {
		return PolicyStatus{Status: "ok", Mode: "allow_all", EnforcementMode: enforcementMode}
	}
	np, _ := ToNetworkPolicy(p)
	mode := "deny_all"
	if np.DefaultAction == Allow {
		mode = "allow_all"
	}
	return PolicyStatus{Status: "ok", Mode: mode, EnforcementMode: enforcementMode, PolicyMode: string(p.EffectiveMode()), Policy: &np}
}

// ParseMode reads a mode given outside a document (a query parameter): "enforce",
// "audit", or the legacy "report" (read as audit). Errors wrap ErrInvalid.
func ParseMode(s string) (Mode, error) {
	switch m := normalMode(Mode(strings.TrimSpace(s))); m {
	case Enforce, AuditMode:
		return m, nil
	}
	return "", fmt.Errorf("%w: mode %q is not one of enforce, audit", ErrInvalid, s)
}

// ParseRules reads a PATCH /policy body: a non-empty JSON (or YAML) list of rules, each
// {action, target} with the optional Airlock fields, validated like Parse.
func ParseRules(source string, data []byte) ([]Rule, error) {
	p := &parser{src: source}
	root, err := p.document(data)
	if err != nil {
		return nil, err
	}
	if root.Kind == yaml.SequenceNode && len(root.Content) == 0 {
		return nil, errors.Join(&Error{Source: source, Line: root.Line, Reason: "the rule list is empty (at least one rule is required)"})
	}
	rules := p.rules(root, "rules")
	if err := p.err(); err != nil {
		return nil, err
	}
	return rules, nil
}

// ParseTargets reads a DELETE /policy body: a non-empty JSON (or YAML) list of target
// strings, each valid per ParseTarget.
func ParseTargets(source string, data []byte) ([]string, error) {
	p := &parser{src: source}
	root, err := p.document(data)
	if err != nil {
		return nil, err
	}
	if root.Kind == yaml.SequenceNode && len(root.Content) == 0 {
		return nil, errors.Join(&Error{Source: source, Line: root.Line, Reason: "the target list is empty (at least one target is required)"})
	}
	var out []string
	p.list(root, "targets", func(_ int, v *yaml.Node, path string) {
		s, ok := p.str(v, path)
		if !ok {
			return
		}
		if _, err := ParseTarget(s); err != nil {
			p.errorf(v, path, "%s", err)
			return
		}
		out = append(out, s)
	})
	if err := p.err(); err != nil {
		return nil, err
	}
	return out, nil
}

// Patch merges incoming rules into p and returns the new policy (p is unchanged):
// incoming rules come first (they take priority under first-match), an existing rule
// whose target equals an incoming target is dropped, and among incoming rules with the
// same target the first wins. Targets compare in canonical form ("Example.COM." equals
// "example.com"). A nil p starts from an empty deny-by-default policy. The result is
// re-validated; an error leaves nothing changed.
func Patch(p *Policy, incoming []Rule) (*Policy, error) {
	out := p.Clone()
	if out == nil {
		out = &Policy{}
	}
	seen := map[string]bool{}
	merged := make([]Rule, 0, len(incoming)+len(out.Egress))
	for i, r := range incoming {
		t, err := ParseTarget(r.Target)
		if err != nil {
			return nil, fmt.Errorf("%w: rules[%d]: %w", ErrInvalid, i, err)
		}
		if seen[t.String()] {
			continue
		}
		seen[t.String()] = true
		merged = append(merged, r)
	}
	for _, r := range out.Egress {
		t, err := ParseTarget(r.Target)
		if err == nil && seen[t.String()] {
			continue
		}
		merged = append(merged, r)
	}
	out.Egress = merged
	return revalidate(out)
}

// RemoveTargets returns p without the rules whose target is one of targets (canonical
// comparison); unknown targets are ignored, as the spec says. p is unchanged.
func RemoveTargets(p *Policy, targets []string) (*Policy, error) {
	out := p.Clone()
	if out == nil {
		out = &Policy{}
	}
	drop := map[string]bool{}
	for i, s := range targets {
		t, err := ParseTarget(s)
		if err != nil {
			return nil, fmt.Errorf("%w: targets[%d]: %w", ErrInvalid, i, err)
		}
		drop[t.String()] = true
	}
	out.Egress = slices.DeleteFunc(out.Egress, func(r Rule) bool {
		t, err := ParseTarget(r.Target)
		return err == nil && drop[t.String()]
	})
	return revalidate(out)
}

// revalidate round-trips p through its JSON form and Parse, so a merged policy obeys
// exactly the rules of a parsed one. Rule lines are kept.
func revalidate(p *Policy) (*Policy, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	src := p.Source
	if src == "" {
		src = "policy"
	}
	q, err := Parse(src, b)
	if err != nil {
		return nil, err
	}
	for i := range q.Egress {
		q.Egress[i].Line, q.Egress[i].column = p.Egress[i].Line, p.Egress[i].column
		if p.Egress[i].src != "" {
			q.Egress[i].src = p.Egress[i].src
		}
	}
	return q, nil
}
