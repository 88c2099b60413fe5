package egressd

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/sdk"
)

// TestEgressdHTTPRulesHTTP2: an intercepted host speaks HTTP/2 with the sandbox when
// the client offers it, and every stream of one HTTP/2 connection is checked on its
// own: a GET then a DELETE on the same connection (curl reuses it: no new connect)
// get 200 and 403 naming the rule, each audited, and the DELETE never reaches the
// server. The server answers with HTTP/1.1's Keep-Alive field, as Node's does; the
// HTTP/2 answers must not carry it (curl ends such a stream with PROTOCOL_ERROR).
// Both datapaths.
func TestEgressdHTTPRulesHTTP2(t *testing.T) {
	w, writes, intercept := rulesWorld(t, map[string]netip.Addr{"rules.test.": rulesIP})
	const policy = `{"defaultAction":"deny","egress":[
	  {"action":"allow","target":"rules.test","http":{
	    "rules":[{"action":"deny","methods":["DELETE"],"path":"/repos/*"}],
	    "access":"read-only"}}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		const out = ` -o /dev/null -w '%{http_code} %{http_version} %{num_connects}\n' `
		code, got := sh(t, x, "curl -sS -m 5 --http2"+out+"https://rules.test/repos/o/r --next -X DELETE"+out+"https://rules.test/repos/o/r")
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if code != 0 || len(lines) != 2 || lines[0] != "200 2 1" || lines[1] != "403 2 0" {
			t.Fatalf("GET then DELETE over one HTTP/2 connection = %d %q, want [200 2 1] [403 2 0] (status, HTTP version, new connections)", code, got)
		}
		w.waitAudit(t, sb.ID, "the DELETE stream denied", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "deny" && r.Rule == "egress[0].http.rules[0]" && r.Extra["method"] == "DELETE"
		})
		w.waitAudit(t, sb.ID, "the GET stream allowed", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "allow" && r.Extra["method"] == "GET"
		})
		if n := writes.Load(); n != 0 {
			t.Errorf("the server saw %d requests other than GET", n)
		}
	}, intercept)
}

// TestEgressdMCPRules: a real sandbox calls an MCP server's tools through the
// interception, on each datapath: the allowlisted tool reaches the server, another
// tool gets 403 naming the rule and never reaches it, and both decisions are audited
// with their rules. curl offers HTTP/2, so each call is a stream checked on its own.
func TestEgressdMCPRules(t *testing.T) {
	w, writes, intercept := rulesWorld(t, map[string]netip.Addr{"rules.test.": rulesIP})
	const policy = `{"defaultAction":"deny","egress":[
	  {"action":"allow","target":"rules.test","http":{"rules":[
	    {"action":"allow","methods":["POST"],"path":"/mcp","jsonrpc":["tools/call"],"mcpTools":["search"]}]}}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		before := writes.Load()
		call := func(tool string) string {
			body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `"}}`
			_, out := sh(t, x, `curl -sS -m 5 -H 'Content-Type: application/json' -d '`+body+`' -w ' %{http_code}' https://rules.test/mcp`)
			return strings.TrimSpace(out)
		}
		if got := call("search"); !strings.HasSuffix(got, " 200") || writes.Load() != before+1 {
			t.Fatalf("the allowlisted tool: %q, server calls %d, want 200 and 1", got, writes.Load()-before)
		}
		got := call("delete_repo")
		if !strings.HasSuffix(got, " 403") || !strings.Contains(got, `"rule":"egress[0].http.default"`) {
			t.Errorf("another tool: %q, want 403 naming egress[0].http.default", got)
		}
		if n := writes.Load() - before; n != 1 {
			t.Errorf("the server saw %d tool calls, want 1 (the refused one must not reach it)", n)
		}
		w.waitAudit(t, sb.ID, "the refused tool call", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "deny" && r.Rule == "egress[0].http.default" && r.Extra["method"] == "POST"
		})
		w.waitAudit(t, sb.ID, "the allowed tool call", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "allow" && r.Rule == "egress[0].http.rules[0]"
		})
	}, intercept)
}
