package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/airlockdev/airlock/policies"
)

// explainHTTP decides one HTTP request (method, raw URL, "Name: value" headers) under d:
// the host at the URL's port, then the host's HTTP rules, and prints every HTTP rule of
// the host with whether it matches.
func explainHTTP(out io.Writer, d *policies.Decider, floor []policies.FloorEntry, method, rawURL string, headers []string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("URL %q: %w", rawURL, err)
	}
	var port uint16
	switch u.Scheme {
	case "http":
		port = 80
	case "https":
		port = 443
	default:
		return fmt.Errorf("URL %q: want an http:// or https:// URL", rawURL)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("URL %q: bad port", rawURL)
		}
		port = uint16(n)
	}
	h := http.Header{}
	for _, kv := range headers {
		k, v, ok := strings.Cut(kv, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("--header %q: want \"Name: value\"", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	explain(out, d, floor, u.Hostname(), port, policies.TCP)
	dec := d.Decide(u.Hostname(), port, policies.TCP)
	fmt.Fprintf(out, "request:  %s %s\n", method, rawURL)
	switch {
	case !dec.Allowed() && !dec.WouldDeny:
		fmt.Fprintln(out, "http:     the host is denied; no request reaches it")
		return nil
	case dec.HTTP == nil:
		fmt.Fprintln(out, "http:     the host has no HTTP rules: every request is allowed (HTTPS is spliced, not intercepted)")
		return nil
	}
	q := policies.HTTPRequest{Method: method, EscapedPath: u.EscapedPath(), RawQuery: u.RawQuery, Header: h}
	if q.EscapedPath == "" {
		q.EscapedPath = "/"
	}
	hd, matches := dec.HTTP.Explain(q)
	verdict := string(hd.Action)
	if hd.WouldDeny {
		verdict += " (audit mode: would_deny, enforce would deny)"
	}
	fmt.Fprintf(out, "http decision: %s\n", verdict)
	fmt.Fprintf(out, "http mode:     %s\n", dec.HTTP.Mode())
	fmt.Fprintf(out, "http rule:     %s\n", hd.Rule)
	fmt.Fprintf(out, "http reason:   %s\n", hd.Reason)
	fmt.Fprintln(out, "http rules in evaluation order (HTTPS to this host is intercepted with the sandbox's CA):")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	decided := false
	for _, m := range matches {
		mark, note := " ", ""
		switch {
		case m.Rule == hd.Rule && m.Matches && !decided:
			mark, note, decided = "*", "decides", true
		case m.Matches && decided:
			note = "shadowed"
		case m.Matches:
			note = "matches"
		}
		fmt.Fprintf(tw, "  %s %s\t%s\t%s\n", mark, m.Rule, m.Desc, note)
	}
	tw.Flush()
	return nil
}
