package egressd

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// rulesFor compiles doc and returns host's HTTP rules at port 443.
func rulesFor(t *testing.T, doc, host string) *policies.HTTPHost {
	t.Helper()
	d, err := policies.Load("p.yaml", []byte(doc), policies.CompileOptions{Version: 4})
	if err != nil {
		t.Fatal(err)
	}
	dec := d.DecideName(host, 443, policies.TCP)
	if dec.HTTP == nil {
		t.Fatalf("%s has no HTTP rules: %+v", host, dec)
	}
	return dec.HTTP
}

const readOnlyDoc = `
egress:
  - action: allow
    target: example.com
    http:
      rules:
        - {action: deny, methods: [DELETE], path: "/v1/*"}
      access: read-only
`

// TestInterceptedHTTPRules runs an intercepted connection (TLS with the sandbox's CA,
// and plain HTTP) whose host has HTTP rules and no vault binding: GET passes, with no
// credential; POST and DELETE get 403 with a JSON body naming the rule and never reach
// the upstream; a lower-case method is checked (and forwarded) upper-cased; every
// request is audited with its rule.
func TestInterceptedHTTPRules(t *testing.T) {
	for _, isTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "https", false: "http"}[isTLS], func(t *testing.T) {
			r := newCredRig(t, isTLS)
			r.rules, r.policyOnly = rulesFor(t, readOnlyDoc, "example.com"), true
			code, seen, _ := r.do(t, "GET", "/v1/models", "example.com", nil)
			if code != 200 || seen["method"] != "GET" || authOf(seen) != "" {
				t.Fatalf("GET: %d %v", code, seen)
			}
			for _, c := range []struct{ method, rule string }{
				{"POST", "egress[0].http.default"},
				{"DELETE", "egress[0].http.rules[0]"},
				{"delete", "egress[0].http.rules[0]"},
			} {
				before := r.hits.Load()
				code, body := r.raw(t, c.method, "/v1/models", "")
				if code != http.StatusForbidden || body.Code != "EGRESS_DENIED" || body.Rule != c.rule || !strings.Contains(body.Message, c.rule) {
					t.Errorf("%s: %d %+v, want 403 naming %s", c.method, code, body, c.rule)
				}
				if r.hits.Load() != before {
					t.Errorf("%s reached the upstream", c.method)
				}
			}
			// A tunnel inside the intercepted connection would carry unchecked requests.
			if code, body := r.raw(t, "CONNECT", "example.com:443", ""); code != http.StatusForbidden || body.Rule != "l7" {
				t.Errorf("CONNECT: %d %+v, want 403 naming l7", code, body)
			}
			code, seen, _ = r.do(t, "get", "/v1/x", "example.com", nil)
			if code != 200 || seen["method"] != "GET" {
				t.Fatalf("get: %d %v (the upstream must see the method that was checked)", code, seen)
			}
			var l7, cred int
			r.sink.mu.Lock()
			recs := append([]audit.Record(nil), r.sink.recs...)
			r.sink.mu.Unlock()
			for _, rec := range recs {
				switch rec.Source {
				case audit.SourceL7:
					l7++
					if rec.Rule == "" || rec.Extra["method"] == nil || rec.PolicyVersion != 4 {
						t.Errorf("record without rule, method or version: %+v", rec)
					}
				case audit.SourceCredential:
					cred++
				}
			}
			if l7 != 6 || cred != 0 {
				t.Errorf("%d l7 and %d credential records, want 6 and 0", l7, cred)
			}
		})
	}
}

// raw sends one request and decodes the JSON error body.
func (r *credRig) raw(t *testing.T, method, path, body string) (int, httpDenied) {
	t.Helper()
	client, server := net.Pipe()
	go r.cp.serve(server, nil, credTarget{sandbox: "sbx", host: r.host, dst: r.dst, src: "10.0.0.2:4000",
		http: r.rules, policyOnly: r.policyOnly}, r.isTLS)
	defer client.Close()
	var conn net.Conn = client
	if r.isTLS {
		tc := tls.Client(client, &tls.Config{ServerName: r.host, RootCAs: r.caPool})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		conn = tc
	}
	head := method + " " + path + " HTTP/1.1\r\nHost: " + r.host + "\r\nConnection: close\r\n"
	if body != "" {
		head += "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
	}
	if _, err := conn.Write([]byte(head + "\r\n" + body)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var denied httpDenied
	json.NewDecoder(resp.Body).Decode(&denied)
	return resp.StatusCode, denied
}

// TestInterceptedJSONRPC checks an MCP tool allowlist through the interception (TLS
// and plain HTTP): an allowed tool reaches the upstream, another
// tool and a body over maxBody get 403 naming the rule and never reach it.
func TestInterceptedJSONRPC(t *testing.T) {
	const doc = `
egress:
  - action: allow
    target: example.com
    http:
      maxBody: 300
      rules:
        - {action: allow, methods: [POST], path: /mcp, jsonrpc: [tools/list, tools/call], mcpTools: [search]}
`
	for _, isTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "https", false: "http"}[isTLS], func(t *testing.T) {
			r := newCredRig(t, isTLS)
			r.rules, r.policyOnly = rulesFor(t, doc, "example.com"), true
			call := func(tool string) string {
				return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `"}}`
			}
			if code, _ := r.raw(t, "POST", "/mcp", call("search")); code != 200 || r.hits.Load() != 1 {
				t.Fatalf("allowed tool: %d, upstream hits %d", code, r.hits.Load())
			}
			for _, c := range []struct{ name, body, rule, reason string }{
				{"other-tool", call("delete_repo"), "egress[0].http.default", "no HTTP rule matches"},
				{"too-large", call("search" + strings.Repeat(" ", 300)), "egress[0].http.rules[0]", "too large to check"},
			} {
				code, denied := r.raw(t, "POST", "/mcp", c.body)
				if code != 403 || denied.Rule != c.rule || !strings.Contains(denied.Message, c.reason) {
					t.Errorf("%s: %d %+v, want 403 naming %s (%s)", c.name, code, denied, c.rule, c.reason)
				}
			}
			if r.hits.Load() != 1 {
				t.Errorf("refused requests reached the upstream (%d hits)", r.hits.Load())
			}
		})
	}
}
