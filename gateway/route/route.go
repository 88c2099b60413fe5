// Package route parses how a request addresses a sandbox port through the gateway, in the
// order docs/architecture.md#ingress-the-gateway gives:
//
//  1. header  OpenSandbox-Ingress-To: <id>-<port>        (form "header")
//     headers X-Airlock-Sandbox: <id> + X-Airlock-Port: <port>   (form "airlock_header")
//  2. host    <port>-<id>.<base domain> or <id>-<port>.<base domain>   (form "host")
//  3. path    /sandboxes/<id>/proxy/<port>/…  (OpenSandbox server proxy; "port" is
//     accepted for "proxy" as in the spec's Endpoint example)   (form "path_proxy")
//     path    /<id>/<port>/…                                            (form "path")
//
// The header value, the host label and the short path may also carry a signed route
// (package signedurl): <port>-<id>-<exp>-<tag>, <id>-<port>-<exp>-<tag> or
// /<id>/<port>/<exp>/<tag>/…, as in OpenSandbox OSEP-0011.
//
// Sandbox ids may contain "-", so one label can read several ways; Parse returns every
// reading as a Candidate, most specific first, and the caller keeps the first whose
// sandbox exists (the registry decides). Parse is pure: no I/O, no lookups.
package route

import (
	"errors"
	"strings"

	"github.com/airlockdev/airlock/gateway/signedurl"
)

// Form says where a request named its sandbox.
type Form uint8

// Forms, in the order they are tried.
const (
	FormNone Form = iota
	FormHeader
	FormAirlockHeader
	FormHost
	FormPathProxy
	FormPath
)

var formNames = [...]string{"none", "header", "airlock_header", "host", "path_proxy", "path"}

// String returns the form's name as used in metrics and audit records.
func (f Form) String() string {
	if int(f) < len(formNames) {
		return formNames[f]
	}
	return "unknown"
}

// Errors. Both are HTTP 400 (bad route).
var (
	// ErrNoRoute: the request names no sandbox in any form.
	ErrNoRoute = errors.New("route: request names no sandbox (use a sandbox host, the OpenSandbox-Ingress-To header or /sandboxes/<id>/proxy/<port>/)")
	// ErrMalformed: a form is present but does not parse.
	ErrMalformed = errors.New("route: malformed sandbox route")
)

// Input is what Parse reads from a request.
type Input struct {
	// Host is the Host header (or :authority), with or without a port.
	Host string
	// Path is the escaped request path (url.URL.EscapedPath).
	Path string
	// IngressTo is the OpenSandbox-Ingress-To header ("" when absent).
	IngressTo string
	// Sandbox and Port are X-Airlock-Sandbox and X-Airlock-Port; HasAirlock is true when
	// either header is present.
	Sandbox, Port string
	HasAirlock    bool
}

// Candidate is one reading of the request's route.
type Candidate struct {
	ID   string
	Port int
	Form Form
	// Signed is true when the route carries expires_b36 and tag.
	Signed     bool
	ExpiresB36 string
	Tag        string
	// Prefix is the escaped path prefix the gateway strips before proxying (path forms
	// only); it never ends in "/".
	Prefix string
}

// MaxCandidates bounds how many readings Parse returns.
const MaxCandidates = 4

// Parse reads in and appends the candidates to buf[:0], most specific first. domains are
// the base domains (lowercase, no leading dot), longest first when one is a suffix of
// another. The first form present decides: a malformed header is ErrMalformed, it does
// not fall through to the host or the path.
func Parse(in Input, domains []string, buf []Candidate) ([]Candidate, error) {
	out := buf[:0]
	switch {
	case in.IngressTo != "":
		out = parseLabel(strings.TrimSpace(in.IngressTo), FormHeader, out)
		if len(out) == 0 {
			return out, ErrMalformed
		}
		return out, nil
	case in.HasAirlock:
		id, port := strings.TrimSpace(in.Sandbox), parsePort(strings.TrimSpace(in.Port))
		if !signedurl.ValidID(id) || port == 0 {
			return out, ErrMalformed
		}
		return append(out, Candidate{ID: id, Port: port, Form: FormAirlockHeader}), nil
	}
	if label, ok, err := hostLabel(in.Host, domains); err != nil {
		return out, err
	} else if ok {
		out = parseLabel(label, FormHost, out)
		if len(out) == 0 {
			return out, ErrMalformed
		}
		return out, nil
	}
	out = parsePath(in.Path, out)
	if len(out) == 0 {
		return out, ErrNoRoute
	}
	return out, nil
}

// hostLabel returns the sandbox label of host under one of domains. ok is false when the
// host is not under a base domain (or is the base domain itself); a host with more than
// one label under the domain is ErrMalformed.
func hostLabel(host string, domains []string) (label string, ok bool, err error) {
	if host == "" || host[0] == '[' || len(domains) == 0 {
		return "", false, nil
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	host = strings.TrimSuffix(host, ".")
	for _, d := range domains {
		if len(host) <= len(d)+1 || host[len(host)-len(d)-1] != '.' || !strings.EqualFold(host[len(host)-len(d):], d) {
			continue
		}
		label = host[:len(host)-len(d)-1]
		if strings.IndexByte(label, '.') >= 0 {
			return "", false, ErrMalformed
		}
		return lower(label), true, nil
	}
	return "", false, nil
}

// parseLabel appends the readings of "<port>-<id>", "<id>-<port>" and their signed forms
// "…-<exp>-<tag>": signed before unsigned, port-first before id-first.
func parseLabel(label string, form Form, out []Candidate) []Candidate {
	if n := len(label); n == 0 || n > 256 {
		return out
	}
	// Signed: the last two dash-separated parts are exp and tag.
	if i := strings.LastIndexByte(label, '-'); i > 0 && signedurl.ValidTag(label[i+1:]) {
		tag, rest := label[i+1:], label[:i]
		if j := strings.LastIndexByte(rest, '-'); j > 0 && signedurl.ValidExpiry(rest[j+1:]) {
			if _, err := signedurl.ParseExpiry(rest[j+1:]); err == nil {
				n0 := len(out)
				out = appendPortID(out, rest[:j], form)
				for k := n0; k < len(out); k++ {
					out[k].Signed, out[k].ExpiresB36, out[k].Tag = true, rest[j+1:], tag
				}
			}
		}
	}
	return appendPortID(out, label, form)
}

// appendPortID appends the readings of s as "<port>-<id>" and as "<id>-<port>".
func appendPortID(out []Candidate, s string, form Form) []Candidate {
	n0 := len(out)
	if i := strings.IndexByte(s, '-'); i > 0 {
		if p := parsePort(s[:i]); p != 0 && signedurl.ValidID(s[i+1:]) {
			out = append(out, Candidate{ID: s[i+1:], Port: p, Form: form})
		}
	}
	if i := strings.LastIndexByte(s, '-'); i > 0 {
		if p := parsePort(s[i+1:]); p != 0 && signedurl.ValidID(s[:i]) {
			if len(out) == n0 || out[n0].ID != s[:i] || out[n0].Port != p {
				out = append(out, Candidate{ID: s[:i], Port: p, Form: form})
			}
		}
	}
	return out
}

// parsePath appends the readings of the escaped path p.
func parsePath(p string, out []Candidate) []Candidate {
	if len(p) < 2 || p[0] != '/' {
		return out
	}
	seg := func(s string) (string, string) { // first segment of s (after a leading '/') and the remainder
		s = s[1:]
		if i := strings.IndexByte(s, '/'); i >= 0 {
			return s[:i], s[i:]
		}
		return s, ""
	}
	// /sandboxes/<id>/proxy/<port>[/…]
	if strings.HasPrefix(p, "/sandboxes/") {
		id, rest := seg(p[len("/sandboxes"):])
		if rest != "" {
			kw, rest2 := seg(rest)
			if (kw == "proxy" || kw == "port") && rest2 != "" {
				ps, tail := seg(rest2)
				if port := parsePort(ps); port != 0 && signedurl.ValidID(id) {
					out = append(out, Candidate{ID: id, Port: port, Form: FormPathProxy, Prefix: p[:len(p)-len(tail)]})
				}
			}
		}
	}
	// /<id>/<port>[/<exp>/<tag>][/…]
	id, rest := seg(p)
	if rest == "" || !signedurl.ValidID(id) {
		return out
	}
	ps, tail := seg(rest)
	port := parsePort(ps)
	if port == 0 {
		return out
	}
	if tail != "" {
		exp, tail2 := seg(tail)
		if tail2 != "" {
			tag, tail3 := seg(tail2)
			if signedurl.ValidExpiry(exp) && signedurl.ValidTag(tag) {
				if _, err := signedurl.ParseExpiry(exp); err == nil {
					out = append(out, Candidate{ID: id, Port: port, Form: FormPath, Signed: true,
						ExpiresB36: exp, Tag: tag, Prefix: p[:len(p)-len(tail3)]})
				}
			}
		}
	}
	return append(out, Candidate{ID: id, Port: port, Form: FormPath, Prefix: p[:len(p)-len(tail)]})
}

// parsePort returns the port of a decimal 1..65535 without sign or leading zero, else 0.
func parsePort(s string) int {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0
	}
	return n
}

// lower lowercases ASCII without allocating when s is already lowercase.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// Rest returns the escaped path left after stripping c.Prefix from path, "/" when empty.
func (c Candidate) Rest(path string) string {
	if c.Prefix == "" || !strings.HasPrefix(path, c.Prefix) {
		return path
	}
	if r := path[len(c.Prefix):]; r != "" {
		return r
	}
	return "/"
}
