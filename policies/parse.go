package policies

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Sentinel errors. Every error Parse returns wraps ErrInvalid; lifecycle maps it to
// HTTP 400.
var (
	// ErrInvalid marks a policy document (or rule list, or overlay) that is rejected.
	ErrInvalid = errors.New("invalid policy")
	// ErrEmpty is returned (wrapped in ErrInvalid) for an empty or null document: the
	// caller decides what applies instead (egressd: the operator's default policy).
	ErrEmpty = errors.New("empty policy document")
)

// Error is one problem in a document, located by source name, line and column (1-based;
// 0 when unknown).
type Error struct {
	Source string
	Line   int
	Column int
	// Path is the element's path in the document ("egress[2].target"); may be empty.
	Path   string
	Reason string
	// also is a second sentinel the error matches (ErrEmpty), besides ErrInvalid.
	also error
}

// Error formats "source:line:col: path: reason".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Source)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true (and ErrEmpty for empty documents).
func (e *Error) Unwrap() []error {
	if e.also != nil {
		return []error{ErrInvalid, e.also}
	}
	return []error{ErrInvalid}
}

// maxErrors bounds how many problems one Parse reports.
const maxErrors = 20

// Parse reads a policy document, YAML or JSON, and validates it strictly: unknown keys,
// duplicate keys, bad targets (CIDRs, wildcards such as "foo.*.com"), bad ports,
// protocols, modes, and rules that conflict with an earlier rule for the same target are
// errors. It accepts the Airlock form (README.md) and the OpenSandbox networkPolicy shape
// {defaultAction, egress:[{action,target}]}, which is a subset of it.
//
// source names the document in messages ("policy.yaml"). On failure the error joins one
// *Error per problem (at most 20), each wrapping ErrInvalid; nothing is returned, so a
// rejected document changes nothing. Empty or null documents return ErrEmpty.
//
// Parse is the one validation function the CLI, lifecycle and egressd share.
func Parse(source string, data []byte) (*Policy, error) {
	p := &parser{src: source}
	root, err := p.document(data)
	if err != nil {
		return nil, err
	}
	pol := p.policy(root)
	if err := p.err(); err != nil {
		return nil, err
	}
	pol.Source = source
	return pol, nil
}

// parser walks a yaml.Node tree and collects errors.
type parser struct {
	src  string
	errs []error
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document decodes data into its root node. It returns ErrEmpty for empty documents.
func (p *parser) document(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.Join(&Error{Source: p.src, Reason: ErrEmpty.Error(), also: ErrEmpty})
		}
		e := &Error{Source: p.src, Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			e.Line, _ = strconv.Atoi(m[1])
			e.Reason = m[2]
		} else if line, col, reason, ok := jsonSyntax(data); ok {
			e.Line, e.Column, e.Reason = line, col, reason
		}
		return nil, errors.Join(e)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		return nil, errors.Join(&Error{Source: p.src, Line: line, Column: extra.Column, Reason: "more than one document"})
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, errors.Join(&Error{Source: p.src, Line: root.Line, Column: root.Column, Reason: ErrEmpty.Error(), also: ErrEmpty})
	}
	return root, nil
}

func (p *parser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return errors.Join(p.errs...)
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		return
	}
	e := &Error{Source: p.src, Path: path, Reason: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// fields walks a mapping node, calling the handler for each known key. Unknown and
// duplicate keys are errors.
func (p *parser) fields(n *yaml.Node, path string, handlers map[string]func(v *yaml.Node, path string)) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "expected a mapping, found %s", describe(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		key := k.Value
		sub := key
		if path != "" {
			sub = path + "." + key
		}
		if line, dup := seen[key]; dup {
			p.errorf(k, sub, "duplicate key (first at line %d)", line)
			continue
		}
		seen[key] = k.Line
		h, ok := handlers[key]
		if !ok {
			known := make([]string, 0, len(handlers))
			for name := range handlers {
				known = append(known, name)
			}
			slices.Sort(known)
			p.errorf(k, sub, "unknown key %q (known keys: %s)", key, strings.Join(known, ", "))
			continue
		}
		h(deref(v), sub)
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

// str returns a scalar's text; lists, mappings and null are errors.
func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.errorf(n, path, "expected a string, found %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) integer(n *yaml.Node, path string, lo, hi int) (int, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		p.errorf(n, path, "expected a whole number in %d..%d, found %q", lo, hi, s)
		return 0, false
	}
	return v, true
}

func (p *parser) list(n *yaml.Node, path string, each func(i int, v *yaml.Node, path string)) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "expected a list, found %s", describe(n))
		return
	}
	for i, v := range n.Content {
		each(i, deref(v), fmt.Sprintf("%s[%d]", path, i))
	}
}

func (p *parser) enum(n *yaml.Node, path string, allowed ...string) (string, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return "", false
	}
	if !slices.Contains(allowed, s) {
		p.errorf(n, path, "%q is not one of %s", s, strings.Join(allowed, ", "))
		return "", false
	}
	return s, true
}

// mode parses a mode: enforce, audit, or the legacy spelling report (read as audit).
func (p *parser) mode(n *yaml.Node, path string) Mode {
	s, _ := p.enum(n, path, string(Enforce), string(AuditMode), string(legacyReport))
	return normalMode(Mode(s))
}

func (p *parser) policy(root *yaml.Node) *Policy {
	pol := &Policy{}
	p.fields(root, "", map[string]func(*yaml.Node, string){
		"version": func(v *yaml.Node, path string) {
			if n, ok := p.integer(v, path, 1, math.MaxInt32); ok {
				if n != FormatVersion {
					p.errorf(v, path, "format version %d is not supported (this airlock reads version %d)", n, FormatVersion)
				}
				pol.Version = n
			}
		},
		"name": func(v *yaml.Node, path string) { pol.Name, _ = p.str(v, path) },
		"mode": func(v *yaml.Node, path string) { pol.Mode = p.mode(v, path) },
		"defaultAction": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(Allow), string(Deny))
			pol.DefaultAction = Action(s)
		},
		"l7": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(L7Off), string(L7SNI))
			pol.L7 = L7Mode(s)
		},
		"audit": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(AuditAll), string(AuditDenied))
			pol.Audit = AuditLevel(s)
		},
		"dns": func(v *yaml.Node, path string) { pol.DNS = p.dnsOptions(v, path) },
		"egress": func(v *yaml.Node, path string) {
			if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
				return
			}
			pol.Egress = p.rules(v, path)
		},
	})
	if len(p.errs) == 0 {
		p.conflicts(pol.Egress, "egress")
	}
	if pol.L7 == L7Off && pol.HasHTTP() {
		p.errorf(root, "l7", "l7: off contradicts the http rules, which the L7 proxy enforces (leave l7 out or say sni)")
	}
	return pol
}

// rules parses a rule list (the egress key, or a PATCH body).
func (p *parser) rules(n *yaml.Node, path string) []Rule {
	var out []Rule
	p.list(n, path, func(_ int, v *yaml.Node, path string) {
		out = append(out, p.rule(v, path, true))
	})
	return out
}

func (p *parser) rule(n *yaml.Node, path string, needAction bool) Rule {
	r := Rule{Line: n.Line, column: n.Column, src: p.src}
	var hasAction, hasTarget bool
	var httpNode, modeNode *yaml.Node
	p.fields(n, path, map[string]func(*yaml.Node, string){
		"action": func(v *yaml.Node, path string) {
			s, _ := p.enum(v, path, string(Allow), string(Deny))
			r.Action, hasAction = Action(s), true
		},
		"target": func(v *yaml.Node, path string) {
			hasTarget = true
			s, ok := p.str(v, path)
			if !ok {
				return
			}
			if _, err := ParseTarget(s); err != nil {
				p.errorf(v, path, "%s", err)
			}
			r.Target = s
		},
		"ports": func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) {
				s, ok := p.str(v, path)
				if !ok {
					return
				}
				pr, err := ParsePortRange(s)
				if err != nil {
					p.errorf(v, path, "%s", err)
					return
				}
				r.Ports = append(r.Ports, pr)
			})
			if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				p.errorf(v, path, "empty list: leave ports out to mean every port")
			}
		},
		"protocols": func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) {
				s, ok := p.enum(v, path, string(TCP), string(UDP))
				if ok && !slices.Contains(r.Protocols, Protocol(s)) {
					r.Protocols = append(r.Protocols, Protocol(s))
				}
			})
			if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				p.errorf(v, path, "empty list: leave protocols out to mean tcp and udp")
			}
		},
		"comment": func(v *yaml.Node, path string) { r.Comment, _ = p.str(v, path) },
		"mode": func(v *yaml.Node, path string) {
			if !needAction {
				p.errorf(v, path, "mode is not allowed in the overlay: the overlay is always enforced")
				return
			}
			r.Mode, modeNode = p.mode(v, path), v
		},
		"http": func(v *yaml.Node, path string) {
			if !needAction {
				p.errorf(v, path, "http rules are not allowed in the overlay")
				return
			}
			r.HTTP = p.httpRules(v, path)
			httpNode = v
		},
	})
	if httpNode != nil {
		p.checkHTTPHost(httpNode, strings.TrimSuffix(path, ".http")+".http", r)
	}
	if modeNode != nil && r.Mode != "" && hasAction && r.Action == Allow && httpNode == nil {
		p.errorf(modeNode, path+".mode", "mode applies to a deny rule or to an allow rule's http rules; an allow rule has nothing to audit")
	}
	if n.Kind == yaml.MappingNode {
		if needAction && !hasAction {
			p.errorf(n, path, "missing key \"action\" (allow or deny)")
		}
		if !hasTarget {
			p.errorf(n, path, "missing key \"target\"")
		}
	}
	return r
}

// conflicts reports rules whose target equals an earlier rule's, with a different action
// and overlapping ports and protocols: the later one could never apply as written.
func (p *parser) conflicts(rules []Rule, path string) {
	type prior struct {
		i int
		r Rule
	}
	byTarget := map[string][]prior{}
	for i, r := range rules {
		t, err := ParseTarget(r.Target)
		if err != nil {
			continue
		}
		key := t.String()
		for _, q := range byTarget[key] {
			if q.r.Action != r.Action && ScopesOverlap(q.r, r) {
				p.errs = append(p.errs, &Error{Source: p.src, Line: r.Line, Column: r.column,
					Path: fmt.Sprintf("%s[%d]", path, i),
					Reason: fmt.Sprintf("%s %s conflicts with %s[%d] (%s %s, line %d): same target, overlapping ports and protocols, different action",
						r.Action, r.Target, path, q.i, q.r.Action, q.r.Target, q.r.Line)})
				break
			}
		}
		byTarget[key] = append(byTarget[key], prior{i, r})
	}
}

// ScopesOverlap reports whether two rules' ports and protocols share something (no
// protocols or no ports: all of them).
func ScopesOverlap(a, b Rule) bool {
	protoOverlap := len(a.Protocols) == 0 || len(b.Protocols) == 0
	for _, x := range a.Protocols {
		protoOverlap = protoOverlap || slices.Contains(b.Protocols, x)
	}
	if !protoOverlap {
		return false
	}
	if len(a.Ports) == 0 || len(b.Ports) == 0 {
		return true
	}
	for _, x := range a.Ports {
		for _, y := range b.Ports {
			if x.First <= y.Last && y.First <= x.Last {
				return true
			}
		}
	}
	return false
}

func (p *parser) dnsOptions(n *yaml.Node, path string) *DNSOptions {
	o := &DNSOptions{}
	p.fields(n, path, map[string]func(*yaml.Node, string){
		"queryTypes": func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) {
				s, ok := p.str(v, path)
				if !ok {
					return
				}
				t := strings.ToUpper(s)
				if !validQType(t) {
					p.errorf(v, path, "%q is not a DNS query type name (A, AAAA, MX, TYPE65, ...)", s)
					return
				}
				o.QueryTypes = append(o.QueryTypes, t)
			})
			if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				p.errorf(v, path, "empty list would refuse every query; leave queryTypes out for the defaults")
			}
		},
		"maxLabelLength": func(v *yaml.Node, path string) { o.MaxLabelLength, _ = p.integer(v, path, 1, 63) },
		"maxNameLength":  func(v *yaml.Node, path string) { o.MaxNameLength, _ = p.integer(v, path, 1, 253) },
		"tunnelGuard": func(v *yaml.Node, path string) {
			g := &TunnelGuard{}
			p.fields(v, path, map[string]func(*yaml.Node, string){
				"maxLabelEntropy": func(v *yaml.Node, path string) {
					s, ok := p.str(v, path)
					if !ok {
						return
					}
					f, err := strconv.ParseFloat(s, 64)
					if err != nil || f < 0 || f > 8 || math.IsNaN(f) {
						p.errorf(v, path, "expected bits per character in 0..8, found %q", s)
						return
					}
					g.MaxLabelEntropy = &f
				},
				"minLabelLength":      func(v *yaml.Node, path string) { g.MinLabelLength, _ = p.integer(v, path, 1, 63) },
				"maxQueriesPerMinute": func(v *yaml.Node, path string) { g.MaxQueriesPerMinute, _ = p.integer(v, path, 0, 1_000_000) },
			})
			o.TunnelGuard = g
		},
	})
	return o
}

// jsonSyntax locates a syntax error in a JSON document (yaml.v3 does not always give a
// line): ok is false when data does not look like JSON or parses.
func jsonSyntax(data []byte) (line, col int, reason string, ok bool) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || (trimmed[0] != '{' && trimmed[0] != '[') {
		return 0, 0, "", false
	}
	var v any
	var se *json.SyntaxError
	if err := json.Unmarshal(data, &v); !errors.As(err, &se) {
		return 0, 0, "", false
	}
	off := int(min(se.Offset, int64(len(data))))
	line = 1 + bytes.Count(data[:off], []byte("\n"))
	col = off - bytes.LastIndexByte(data[:off], '\n')
	return line, col, "JSON syntax: " + se.Error(), true
}

// validQType accepts the mnemonic of a known type (resolved by dnsfilter) or TYPEnnn.
func validQType(t string) bool {
	if _, ok := qtypeNames[t]; ok {
		return true
	}
	if n, ok := strings.CutPrefix(t, "TYPE"); ok {
		v, err := strconv.Atoi(n)
		return err == nil && v > 0 && v < 65536
	}
	return false
}

// qtypeNames are the query types a policy may name (RFC 1035, 3596, 9460 and common
// others). ANY (255) and AXFR/IXFR are deliberately absent: they can be allowed only as
// TYPE255 etc., which makes the choice visible.
var qtypeNames = map[string]uint16{
	"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28,
	"SRV": 33, "NAPTR": 35, "DS": 43, "SSHFP": 44, "RRSIG": 46, "NSEC": 47, "DNSKEY": 48,
	"TLSA": 52, "SVCB": 64, "HTTPS": 65, "CAA": 257, "NULL": 10,
}

// QTypeNumber returns the numeric DNS type of a name accepted in queryTypes.
func QTypeNumber(name string) (uint16, bool) {
	if v, ok := qtypeNames[name]; ok {
		return v, true
	}
	if n, ok := strings.CutPrefix(name, "TYPE"); ok {
		v, err := strconv.Atoi(n)
		if err == nil && v > 0 && v < 65536 {
			return uint16(v), true
		}
	}
	return 0, false
}
