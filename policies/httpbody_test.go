package policies

import (
	"strings"
	"testing"
)

const mcpDoc = `
egress:
  - action: allow
    target: mcp.test
    http:
      maxBody: 200
      rules:
        - action: allow
          methods: [POST]
          path: /mcp
          jsonrpc: [initialize, "notifications/*", tools/list, tools/call]
          mcpTools: [search]
`

// TestHTTPJSONRPC checks the body conditions: an allowed method or tool passes, another
// falls to the default, a batch passes only when every message does, a body that is not
// JSON-RPC matches no body rule, and a body too large to check is denied by the rule
// that needed it, saying so.
func TestHTTPJSONRPC(t *testing.T) {
	h := httpHost(t, mcpDoc, "mcp.test")
	if h.BodyLimit() != 200 {
		t.Fatalf("BodyLimit = %d, want 200", h.BodyLimit())
	}
	cases := []struct {
		name, body string
		tooLarge   bool
		want       Action
		rule       string
	}{
		{"Initialize", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, false, Allow, "egress[0].http.rules[0]"},
		{"Notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, false, Allow, "egress[0].http.rules[0]"},
		{"AllowedTool", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","arguments":{}}}`, false, Allow, "egress[0].http.rules[0]"},
		{"OtherTool", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete_repo"}}`, false, Deny, "egress[0].http.default"},
		{"OtherMethod", `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{}}`, false, Deny, "egress[0].http.default"},
		{"BatchAllAllowed", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search"}}]`, false, Allow, "egress[0].http.rules[0]"},
		{"BatchOneDenied", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"rm"}}]`, false, Deny, "egress[0].http.default"},
		{"NotJSONRPC", `{"method":"tools/list"}`, false, Deny, "egress[0].http.default"},
		{"EmptyBatch", `[]`, false, Deny, "egress[0].http.default"},
		{"TooLarge", `{"jsonrpc":"2.0","method":"tools/list"}`, true, Deny, "egress[0].http.rules[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dec := h.Decide(HTTPRequest{Method: "POST", EscapedPath: "/mcp", Body: []byte(c.body), BodyTooLarge: c.tooLarge})
			if dec.Action != c.want || dec.Rule != c.rule {
				t.Fatalf("= %s by %s (%s), want %s by %s", dec.Action, dec.Rule, dec.Reason, c.want, c.rule)
			}
			if c.tooLarge && !strings.Contains(dec.Reason, "too large to check") {
				t.Errorf("reason %q does not say the body was too large", dec.Reason)
			}
		})
	}
	// A rule without body conditions needs no body.
	if h := httpHost(t, githubLike, "api.github.test"); h.BodyLimit() != 0 {
		t.Errorf("BodyLimit without body rules = %d", h.BodyLimit())
	}
}
