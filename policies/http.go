package policies

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/airlockdev/airlock/policies/httppath"
)

// HTTPRules are the HTTP rules of one allow rule for a name (exact or wildcard): every
// request to that host is checked against them, in order, first match wins, then the
// presets (Access, then Git), then Default. A host with HTTP rules is reached only
// through egressd's L7 proxy: plain HTTP is checked per request, HTTPS is intercepted
// with the sandbox's CA (docs/architecture.md#policies).
//
// YAML:
//
//   - action: allow
//     target: api.github.com
//     http:
//     rules:
//   - {action: deny, methods: [DELETE], path: "/repos/*"}
//   - {action: allow, methods: [POST], path: /graphql, headers: {Content-Type: application/json}}
//     access: read-only   # GET, HEAD, OPTIONS
//     git: [fetch]        # fetch (git-upload-pack) and/or push (git-receive-pack)
//     default: deny       # default deny
type HTTPRules struct {
	// Rules are checked first, in order.
	Rules []HTTPRule `json:"rules,omitempty"`
	// Access is a preset after Rules: "read-only" allows GET, HEAD and OPTIONS on every
	// path. Empty: none.
	Access string `json:"access,omitempty"`
	// Git lists smart-HTTP presets after Access (https://git-scm.com/docs/http-protocol):
	// "fetch" allows GET …/info/refs?service=git-upload-pack and POST …/git-upload-pack
	// (clone, fetch, pull); "push" the same for git-receive-pack.
	Git []string `json:"git,omitempty"`
	// Default applies when nothing above matches: deny (default) or allow.
	Default Action `json:"default,omitempty"`
	// MaxBody bounds, in bytes, how much of a request body the jsonrpc and mcpTools
	// conditions read: default DefaultMaxBody (64 KiB), at most MaxMaxBody (1 MiB).
	MaxBody int `json:"maxBody,omitempty"`
}

// HTTPRule is one HTTP rule: it matches a request when every condition given holds.
type HTTPRule struct {
	// Action is allow or deny.
	Action Action `json:"action"`
	// Methods lists the methods matched (upper-cased when parsed; a request's method is
	// upper-cased before matching); empty means every method.
	Methods []string `json:"methods,omitempty"`
	// Path matches the request path after percent-decoding (policies/httppath: a path
	// with dot segments, "//", a backslash or an encoded delimiter matches no rule and
	// is denied). Case-sensitive. Without "*" it is exact ("/v1/chat/completions"); with
	// one "*" at its end a prefix ("/repos/*", as the vault's bindings); otherwise a
	// glob where "*" matches within a segment and "**" across segments
	// ("/repos/*/*/pulls", "/**/info/refs"). Empty means every path.
	Path string `json:"path,omitempty"`
	// Query maps parameter names to the value one of their occurrences must have ("*":
	// present with any value).
	Query map[string]string `json:"query,omitempty"`
	// Headers maps header names (case-insensitive) to the value one of their
	// occurrences must have, exactly ("*": present with any value).
	Headers map[string]string `json:"headers,omitempty"`
	// JSONRPC lists the JSON-RPC 2.0 methods the body may call (exact, or a prefix
	// ending in "*": "notifications/*"): the rule matches a body that is one request or
	// a batch whose every method is listed. The body is read up to HTTPRules.MaxBody; a
	// larger one cannot be checked and is denied when this rule is reached.
	JSONRPC []string `json:"jsonrpc,omitempty"`
	// MCPTools lists the MCP tools a "tools/call" in the body may name (params.name);
	// other methods pass this condition (restrict them with JSONRPC). Body as JSONRPC.
	MCPTools []string `json:"mcpTools,omitempty"`
	// Comment is free text shown by `airlock policy explain`.
	Comment string `json:"comment,omitempty"`
	// Mode, on a deny rule, overrides the mode of the host's rules (the egress rule's,
	// else the policy's): audit lets a request it denies pass as would_deny.
	Mode Mode `json:"mode,omitempty"`
	// Line is the rule's line in its source document (0 when built in code).
	Line int `json:"-"`
}

// HTTP presets.
const (
	AccessReadOnly = "read-only"
	GitFetch       = "fetch"
	GitPush        = "push"
)

// HasHTTP reports whether some rule of p has HTTP rules.
func (p *Policy) HasHTTP() bool {
	return p != nil && slices.ContainsFunc(p.Egress, func(r Rule) bool { return r.HTTP != nil })
}

func (h *HTTPRules) clone() *HTTPRules {
	if h == nil {
		return nil
	}
	c := *h
	c.Git = slices.Clone(h.Git)
	c.Rules = make([]HTTPRule, len(h.Rules))
	for i, r := range h.Rules {
		r.Methods = slices.Clone(r.Methods)
		r.Query = maps.Clone(r.Query)
		r.Headers = maps.Clone(r.Headers)
		r.JSONRPC = slices.Clone(r.JSONRPC)
		r.MCPTools = slices.Clone(r.MCPTools)
		c.Rules[i] = r
	}
	return &c
}

// httpRules parses an egress rule's "http" mapping.
func (p *parser) httpRules(n *yaml.Node, path string) *HTTPRules {
	h := &HTTPRules{}
	p.fields(n, path, map[string]func(*yaml.Node, string){
		"rules": func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) { h.Rules = append(h.Rules, p.httpRule(v, path)) })
		},
		"access": func(v *yaml.Node, path string) { h.Access, _ = p.enum(v, path, AccessReadOnly) },
		"git": func(v *yaml.Node, path string) {
			add := func(v *yaml.Node, path string) {
				if s, ok := p.enum(v, path, GitFetch, GitPush); ok && !slices.Contains(h.Git, s) {
					h.Git = append(h.Git, s)
				}
			}
			if v.Kind == yaml.ScalarNode {
				add(v, path)
				return
			}
			p.list(v, path, func(_ int, v *yaml.Node, path string) { add(v, path) })
		},
		"default": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(Allow), string(Deny))
			h.Default = Action(s)
		},
		"maxBody": func(v *yaml.Node, path string) { h.MaxBody, _ = p.integer(v, path, 1, MaxMaxBody) },
	})
	if n.Kind == yaml.MappingNode && len(h.Rules) == 0 && h.Access == "" && len(h.Git) == 0 && h.Default == "" {
		p.errorf(n, path, "empty: give rules, a preset (access, git) or a default")
	}
	return h
}

func (p *parser) httpRule(n *yaml.Node, path string) HTTPRule {
	r := HTTPRule{Line: n.Line}
	hasAction := false
	var modeNode *yaml.Node
	strMap := func(v *yaml.Node, path string, header bool) map[string]string {
		if v.Kind != yaml.MappingNode {
			p.errorf(v, path, "expected a mapping of names to values, found %s", describe(v))
			return nil
		}
		m := map[string]string{}
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, val := deref(v.Content[i]), deref(v.Content[i+1])
			name, ok := p.str(k, path)
			if !ok {
				continue
			}
			if name == "" || (header && !isToken(name)) {
				p.errorf(k, path, "%q is not a valid name", name)
				continue
			}
			if header {
				name = strings.ToLower(name)
			}
			if _, dup := m[name]; dup {
				p.errorf(k, path+"."+name, "duplicate name")
				continue
			}
			if s, ok := p.str(val, path+"."+name); ok {
				m[name] = s
			}
		}
		return m
	}
	p.fields(n, path, map[string]func(*yaml.Node, string){
		"action": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(Allow), string(Deny))
			r.Action, hasAction = Action(s), true
		},
		"methods": func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) {
				s, ok := p.str(v, path)
				if !ok {
					return
				}
				if !isToken(s) {
					p.errorf(v, path, "%q is not an HTTP method (RFC 9110 §9: a token)", s)
					return
				}
				if m := strings.ToUpper(s); !slices.Contains(r.Methods, m) {
					r.Methods = append(r.Methods, m)
				}
			})
			if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				p.errorf(v, path, "empty list: leave methods out to mean every method")
			}
		},
		"path": func(v *yaml.Node, path string) {
			s, ok := p.str(v, path)
			if !ok {
				return
			}
			if err := checkPathPattern(s); err != nil {
				p.errorf(v, path, "%s", err)
			}
			r.Path = s
		},
		"query":    func(v *yaml.Node, path string) { r.Query = strMap(v, path, false) },
		"headers":  func(v *yaml.Node, path string) { r.Headers = strMap(v, path, true) },
		"comment":  func(v *yaml.Node, path string) { r.Comment, _ = p.str(v, path) },
		"mode":     func(v *yaml.Node, path string) { r.Mode, modeNode = p.mode(v, path), v },
		"jsonrpc":  func(v *yaml.Node, path string) { r.JSONRPC = p.nameList(v, path) },
		"mcpTools": func(v *yaml.Node, path string) { r.MCPTools = p.nameList(v, path) },
	})
	if n.Kind == yaml.MappingNode && !hasAction {
		p.errorf(n, path, "missing key \"action\" (allow or deny)")
	}
	if modeNode != nil && r.Mode != "" && r.Action == Allow {
		p.errorf(modeNode, path+".mode", "mode applies to a deny rule; an allow rule has nothing to audit")
	}
	return r
}

// nameList parses a non-empty list of non-empty names (jsonrpc methods, MCP tools).
func (p *parser) nameList(n *yaml.Node, path string) []string {
	var out []string
	p.list(n, path, func(_ int, v *yaml.Node, path string) {
		if s, ok := p.str(v, path); ok {
			if s == "" || strings.Contains(strings.TrimSuffix(s, "*"), "*") {
				p.errorf(v, path, "%q: want a name, or a prefix ending in \"*\"", s)
				return
			}
			out = append(out, s)
		}
	})
	if n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
		p.errorf(n, path, "empty list: leave it out to look at no body")
	}
	return out
}

// checkHTTPHost reports an egress rule whose http rules cannot apply as written.
func (p *parser) checkHTTPHost(n *yaml.Node, path string, r Rule) {
	if r.Action != Allow {
		p.errorf(n, path, "http rules belong to an allow rule (a deny rule already refuses every request)")
	}
	if t, err := ParseTarget(r.Target); err == nil && t.Kind != KindName && t.Kind != KindWildcard {
		p.errorf(n, path, "http rules need a name or *.suffix target, not %q: requests are matched to hosts by name", r.Target)
	}
	for _, pr := range r.Ports {
		if pr != (PortRange{80, 80}) && pr != (PortRange{443, 443}) {
			p.errorf(n, path, "http rules apply on ports 80 and 443 only (the L7 proxy's), not %s", pr)
		}
	}
	if slices.Contains(r.Protocols, UDP) {
		p.errorf(n, path, "http rules apply to tcp only")
	}
}

// checkPathPattern validates an HTTP rule's path pattern: it starts with "/", is
// canonical once its "*" are set aside (httppath.Canonical), and holds no "***".
func checkPathPattern(s string) error {
	if !strings.HasPrefix(s, "/") {
		return fmt.Errorf("path %q must start with /", s)
	}
	if strings.Contains(s, "***") {
		return fmt.Errorf("path %q: \"***\" means nothing; use \"*\" (within a segment) or \"**\" (across segments)", s)
	}
	if _, err := httppath.Canonical(strings.ReplaceAll(s, "*", "x")); err != nil {
		return fmt.Errorf("path %q is not canonical: %s (requests with such paths are denied before any rule)", s, strings.TrimPrefix(err.Error(), httppath.ErrNotCanonical.Error()+": "))
	}
	if strings.ContainsAny(s, "?#") {
		return fmt.Errorf("path %q holds a query or fragment: match query parameters with query", s)
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token (methods, header names).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
