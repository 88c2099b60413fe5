package policies

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/policies/httppath"
)

// HTTPRequest is what an HTTP rule sees of one request.
type HTTPRequest struct {
	// Method as sent; it is upper-cased before matching (the L7 proxy forwards the
	// upper-cased form, so the upstream acts on what was checked).
	Method string
	// EscapedPath is the target's path as it travelled (url.URL.EscapedPath, no query).
	EscapedPath string
	// RawQuery is the target's query without "?" (url.URL.RawQuery).
	RawQuery string
	// Header holds the request's headers (canonical keys, as net/http reads them).
	Header http.Header
	// Body is the start of the request body, read by the caller when
	// HTTPHost.BodyLimit() > 0: at most that many bytes. BodyTooLarge says the body was
	// longer, so body rules cannot be checked (the first one reached denies).
	Body         []byte
	BodyTooLarge bool
}

// HTTPHost is the compiled HTTP rules of one egress rule (Decision.HTTP): immutable and
// safe for concurrent use. Decide performs no I/O.
type HTTPHost struct {
	owner   string // the egress rule, "egress[2]"
	rules   []hrule
	def     Action
	defRef  string
	mode    Mode
	version uint64
	// Indexes: rule positions ascending. exact by decoded path, prefix by prefix (with
	// prefixLens the distinct lengths, ascending), other the globs and path-less rules.
	exact      map[string][]int32
	prefix     map[string][]int32
	prefixLens []int
	other      []int32
	needsQuery bool
	maxBody    int // > 0 when some rule reads the body
}

// hrule is a compiled HTTP rule.
type hrule struct {
	action  Action
	methods []string // upper-case; nil: every method
	kind    pathKind
	path    string   // exact path or prefix
	glob    []string // glob pattern split at '/' (kind pathGlob)
	query   [][2]string
	headers [][2]string // lower-case names
	// rpcMethods and mcpTools are the body conditions (nil: none).
	rpcMethods, mcpTools []string
	// mode is the rule's effective mode (its own, else the host's).
	mode Mode
	ref  string
	desc string
	raw  HTTPRule
}

type pathKind uint8

const (
	pathAny pathKind = iota
	pathExact
	pathPrefix
	pathGlob
)

// compileHTTP compiles the HTTP rules of egress rule ref (presets expanded).
func compileHTTP(ref, source string, h *HTTPRules, mode Mode, version uint64) *HTTPHost {
	c := &HTTPHost{owner: ref, def: h.Default, defRef: ref + ".http.default", mode: mode, version: version,
		exact: map[string][]int32{}, prefix: map[string][]int32{}}
	if c.def == "" {
		c.def = Deny
	}
	add := func(r HTTPRule, sub string) {
		hr := hrule{action: r.Action, methods: r.Methods, ref: ref + ".http." + sub, raw: r,
			rpcMethods: r.JSONRPC, mcpTools: r.MCPTools, mode: cmp.Or(normalMode(r.Mode), mode)}
		if hr.readsBody() {
			c.maxBody = cmp.Or(h.MaxBody, DefaultMaxBody)
		}
		if len(hr.methods) == 0 {
			hr.methods = nil
		}
		switch n := strings.Count(r.Path, "*"); {
		case r.Path == "":
			hr.kind = pathAny
		case n == 0:
			hr.kind, hr.path = pathExact, r.Path
		case n == 1 && strings.HasSuffix(r.Path, "*"):
			hr.kind, hr.path = pathPrefix, strings.TrimSuffix(r.Path, "*")
		default:
			hr.kind, hr.glob = pathGlob, strings.Split(r.Path[1:], "/")
		}
		for _, k := range slices.Sorted(maps.Keys(r.Query)) {
			hr.query = append(hr.query, [2]string{k, r.Query[k]})
		}
		for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
			hr.headers = append(hr.headers, [2]string{strings.ToLower(k), r.Headers[k]})
		}
		c.needsQuery = c.needsQuery || len(hr.query) > 0
		hr.desc = hr.describe(source)
		idx := int32(len(c.rules))
		c.rules = append(c.rules, hr)
		switch hr.kind {
		case pathExact:
			c.exact[hr.path] = append(c.exact[hr.path], idx)
		case pathPrefix:
			if _, ok := c.prefix[hr.path]; !ok {
				c.prefixLens = append(c.prefixLens, len(hr.path))
			}
			c.prefix[hr.path] = append(c.prefix[hr.path], idx)
		default:
			c.other = append(c.other, idx)
		}
	}
	for i, r := range h.Rules {
		add(r, fmt.Sprintf("rules[%d]", i))
	}
	if h.Access == AccessReadOnly {
		add(HTTPRule{Action: Allow, Methods: []string{http.MethodGet, http.MethodHead, http.MethodOptions},
			Comment: "access: read-only"}, "access")
	}
	for _, g := range h.Git {
		svc := "git-upload-pack"
		if g == GitPush {
			svc = "git-receive-pack"
		}
		add(HTTPRule{Action: Allow, Methods: []string{http.MethodGet}, Path: "/**/info/refs",
			Query: map[string]string{"service": svc}, Comment: "git: " + g}, "git."+g)
		add(HTTPRule{Action: Allow, Methods: []string{http.MethodPost}, Path: "/**/" + svc,
			Comment: "git: " + g}, "git."+g)
	}
	slices.Sort(c.prefixLens)
	c.prefixLens = slices.Compact(c.prefixLens)
	return c
}

func (r *hrule) describe(source string) string {
	var b strings.Builder
	b.WriteString(string(r.action))
	if r.methods != nil {
		b.WriteString(" " + strings.Join(r.methods, ","))
	} else {
		b.WriteString(" any method")
	}
	if r.raw.Path != "" {
		b.WriteString(" " + r.raw.Path)
	}
	for _, q := range r.query {
		fmt.Fprintf(&b, " ?%s=%s", q[0], q[1])
	}
	for _, h := range r.headers {
		fmt.Fprintf(&b, " [%s: %s]", h[0], h[1])
	}
	if r.rpcMethods != nil {
		fmt.Fprintf(&b, " jsonrpc %s", strings.Join(r.rpcMethods, ","))
	}
	if r.mcpTools != nil {
		fmt.Fprintf(&b, " mcp tools %s", strings.Join(r.mcpTools, ","))
	}
	if r.raw.Line > 0 {
		fmt.Fprintf(&b, " (%s:%d)", source, r.raw.Line)
	} else if r.raw.Comment != "" {
		fmt.Fprintf(&b, " (%s)", r.raw.Comment)
	}
	return b.String()
}

// Decide checks one request: the first matching rule's action, else the host's default.
// A request whose path is not canonical (httppath.Canonical) is denied whatever the
// rules say: servers resolve such paths differently, so no rule can be judged on it.
// A denial in audit mode (the rule's, else the host's: the egress rule's, else the
// policy's) becomes Allow with WouldDeny set. Rule names the deciding
// rule ("egress[0].http.rules[2]", "egress[0].http.access", "egress[0].http.git.fetch",
// "egress[0].http.default", or "egress[0].http.path" for a refused path).
//
// A rule with body conditions (jsonrpc, mcpTools) reached by a request whose body was
// too large to check denies it, saying so.
func (h *HTTPHost) Decide(q HTTPRequest) Decision {
	i, path, err := h.first(q)
	if err != nil {
		return h.decision(Deny, h.owner+".http.path", err.Error(), h.mode)
	}
	if i < 0 {
		return h.decision(h.def, h.defRef, fmt.Sprintf("no HTTP rule matches %s %s; default %s", strings.ToUpper(q.Method), path, h.def), h.mode)
	}
	r := &h.rules[i]
	if r.readsBody() && q.BodyTooLarge {
		return h.decision(Deny, r.ref, fmt.Sprintf("the request body is larger than %d bytes, too large to check against %s", h.maxBody, r.desc), h.mode)
	}
	return h.decision(r.action, r.ref, r.desc, r.mode)
}

// BodyLimit returns how many body bytes Decide needs (HTTPRequest.Body): 0 when no
// rule of the host reads the body.
func (h *HTTPHost) BodyLimit() int { return h.maxBody }

func (r *hrule) readsBody() bool { return r.rpcMethods != nil || r.mcpTools != nil }

func (h *HTTPHost) decision(a Action, rule, reason string, mode Mode) Decision {
	dec := Decision{Action: a, Mode: h.mode, Rule: rule, Reason: reason, Version: h.version}
	if a == Deny && mode == AuditMode {
		dec.Action, dec.WouldDeny = Allow, true
	}
	return dec
}

// first returns the index of the first rule matching q (-1: none) and the decoded path.
func (h *HTTPHost) first(q HTTPRequest) (int32, string, error) {
	path, err := httppath.Canonical(q.EscapedPath)
	if err != nil {
		return -1, "", err
	}
	method := q.Method
	if !isUpper(method) {
		method = strings.ToUpper(method)
	}
	var query url.Values
	if h.needsQuery {
		// Values parsed before a malformed pair still count (url.ParseQuery keeps them).
		query, _ = url.ParseQuery(q.RawQuery)
	}
	var rpc []rpcMessage
	rpcOK, rpcRead := false, false
	body := func() ([]rpcMessage, bool) {
		if !rpcRead {
			rpc, rpcOK, rpcRead = nil, false, true
			if !q.BodyTooLarge {
				rpc, rpcOK = parseRPC(q.Body)
			}
		}
		return rpc, rpcOK
	}
	best := int32(-1)
	scan := func(list []int32) {
		for _, i := range list {
			if best >= 0 && i >= best {
				return
			}
			r := &h.rules[i]
			if !r.matches(method, path, query, q.Header) {
				continue
			}
			if r.readsBody() && !q.BodyTooLarge {
				if msgs, ok := body(); !ok || !r.bodyMatches(msgs) {
					continue
				}
			}
			best = i
			return
		}
	}
	scan(h.exact[path])
	for _, n := range h.prefixLens {
		if n > len(path) {
			break
		}
		if l, ok := h.prefix[path[:n]]; ok {
			scan(l)
		}
	}
	scan(h.other)
	return best, path, nil
}

func (r *hrule) matches(method, path string, query url.Values, header http.Header) bool {
	if r.methods != nil && !slices.Contains(r.methods, method) {
		return false
	}
	if r.kind == pathGlob && !globMatch(r.glob, path[1:]) {
		return false
	}
	for _, kv := range r.query {
		vs, ok := query[kv[0]]
		if !ok || (kv[1] != "*" && !slices.Contains(vs, kv[1])) {
			return false
		}
	}
	for _, kv := range r.headers {
		vs, ok := header[http.CanonicalHeaderKey(kv[0])]
		if !ok || (kv[1] != "*" && !slices.Contains(vs, kv[1])) {
			return false
		}
	}
	return true
}

// globMatch matches path segments (path without its leading "/") against pattern
// segments: "**" matches any number of segments (none included), a segment with "*"
// matches within one segment.
func globMatch(pat []string, path string) bool {
	if len(pat) == 0 {
		return path == ""
	}
	if pat[0] == "**" {
		if globMatch(pat[1:], path) {
			return true
		}
		for i := 0; i < len(path); i++ {
			if path[i] == '/' && globMatch(pat[1:], path[i+1:]) {
				return true
			}
		}
		return len(pat) == 1
	}
	seg, rest, more := strings.Cut(path, "/")
	if !segMatch(pat[0], seg) {
		return false
	}
	if !more {
		return len(pat) == 1
	}
	return globMatch(pat[1:], rest)
}

// segMatch matches one segment against a pattern where "*" matches any run of
// characters.
func segMatch(pat, s string) bool {
	star := strings.IndexByte(pat, '*')
	if star < 0 {
		return pat == s
	}
	if !strings.HasPrefix(s, pat[:star]) {
		return false
	}
	s, pat = s[star:], pat[star+1:]
	for i := 0; i <= len(s); i++ {
		if segMatch(pat, s[i:]) {
			return true
		}
	}
	return false
}

func isUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 'a' && s[i] <= 'z' {
			return false
		}
	}
	return true
}

// HTTPMatch is one HTTP rule of a host, for Explain.
type HTTPMatch struct {
	// Rule is the reference ("egress[0].http.rules[1]"), Action its action, Desc its
	// description.
	Rule   string
	Action Action
	Desc   string
	// Matches reports whether the rule matches the request asked about.
	Matches bool
}

// Explain returns the decision for q and every rule of the host (presets expanded)
// with whether it matches q, in evaluation order.
func (h *HTTPHost) Explain(q HTTPRequest) (Decision, []HTTPMatch) {
	dec := h.Decide(q)
	path, err := httppath.Canonical(q.EscapedPath)
	query, _ := url.ParseQuery(q.RawQuery)
	method := strings.ToUpper(q.Method)
	out := make([]HTTPMatch, 0, len(h.rules))
	for i := range h.rules {
		r := &h.rules[i]
		m := err == nil && r.matches(method, path, query, q.Header)
		if r.readsBody() && !q.BodyTooLarge {
			msgs, ok := parseRPC(q.Body)
			m = m && ok && r.bodyMatches(msgs)
		}
		switch r.kind {
		case pathExact:
			m = m && path == r.path
		case pathPrefix:
			m = m && strings.HasPrefix(path, r.path)
		}
		out = append(out, HTTPMatch{Rule: r.ref, Action: r.action, Desc: r.desc, Matches: m})
	}
	return dec, out
}

// Len returns the number of compiled rules (presets expanded).
func (h *HTTPHost) Len() int { return len(h.rules) }

// dump lists the host's compiled HTTP rules and indexes for Decider.Dump.
func (h *HTTPHost) dump(w io.Writer) {
	fmt.Fprintf(w, "  http %s rules=%d exact=%d prefixes=%d other=%d default=%s\n",
		h.owner, len(h.rules), len(h.exact), len(h.prefix), len(h.other), h.def)
	for i := range h.rules {
		fmt.Fprintf(w, "    %s %s\n", h.rules[i].ref, h.rules[i].desc)
	}
}

// Version returns the policy revision the rules belong to.
func (h *HTTPHost) Version() uint64 { return h.version }

// Mode returns the host's mode: its egress rule's, else the policy's (a deny HTTP rule
// may override it).
func (h *HTTPHost) Mode() Mode { return h.mode }
