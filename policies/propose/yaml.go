package propose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// YAML writes the proposed policy in the library's YAML form (what policies.Parse
// reads and a policies.dir file holds), each rule preceded by a comment with what it
// covers and how often it was seen, each proposed HTTP rule followed by its count, and
// the skipped destinations as a closing comment. header, when set, opens the document
// as a comment (one line per line).
func (r *Result) YAML(header string) ([]byte, error) {
	raw, err := json.Marshal(r.Policy)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	blockStyle(&doc)
	root := doc.Content[0]
	if header != "" {
		root.HeadComment = header
	}
	if egress := mapValue(root, "egress"); egress != nil {
		byRule := map[string]RuleReport{}
		for _, rr := range r.Rules {
			byRule[rr.Rule] = rr
		}
		for i, item := range egress.Content {
			rr, ok := byRule[fmt.Sprintf("egress[%d]", i)]
			if !ok {
				continue
			}
			item.HeadComment = ruleComment(rr)
			rules := mapValue(mapValue(item, "http"), "rules")
			for j, hr := range rr.HTTP {
				if rules != nil && j < len(rules.Content) {
					rules.Content[j].HeadComment = fmt.Sprintf("%d requests, %d refused then", hr.Seen, hr.Refused)
				}
			}
		}
	}
	if len(r.Skipped) > 0 {
		var b strings.Builder
		b.WriteString("Seen and not proposed:")
		for _, s := range r.Skipped {
			fmt.Fprintf(&b, "\n  %s (%d×): %s", s.Target, s.Count, s.Reason)
		}
		root.FootComment = b.String()
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	enc.Close()
	return out.Bytes(), nil
}

func ruleComment(rr RuleReport) string {
	what := "new"
	if !rr.New {
		what = "kept"
	}
	s := fmt.Sprintf("%s: %d records, %d refused then", what, rr.Seen, rr.Refused)
	if len(rr.Members) > 0 {
		s += "; stands for " + strings.Join(rr.Members, ", ")
	}
	if rr.Scope == "all" {
		s += "; no port seen (only DNS): every port"
	}
	return s
}

// blockStyle turns the flow style JSON gave every collection into block style, except
// for lists of scalars (ports, methods), which stay on one line.
func blockStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle | yaml.DoubleQuotedStyle
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && needsQuotes(n.Value) {
		n.Style |= yaml.DoubleQuotedStyle
	}
	scalars := n.Kind == yaml.SequenceNode
	for _, c := range n.Content {
		blockStyle(c)
		scalars = scalars && c.Kind == yaml.ScalarNode
	}
	if scalars && len(n.Content) > 0 {
		n.Style |= yaml.FlowStyle
	}
}

// needsQuotes reports whether a string must be quoted to read back as that string.
func needsQuotes(s string) bool {
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		return true
	}
	str, ok := v.(string)
	return !ok || str != s || strings.ContainsAny(s, "*:#")
}

// mapValue returns the value of key in mapping n (nil when absent or n is nil).
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
