package policies

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// Body limits of HTTP rules that look into the request body (jsonrpc, mcpTools).
const (
	// DefaultMaxBody is HTTPRules.MaxBody when unset: 64 KiB.
	DefaultMaxBody = 64 << 10
	// MaxMaxBody is the largest HTTPRules.MaxBody accepted: 1 MiB.
	MaxMaxBody = 1 << 20
)

// rpcMessage is what a body rule reads of one JSON-RPC 2.0 request
// (https://www.jsonrpc.org/specification §4; MCP's tools/call puts the tool's name in
// params.name, https://modelcontextprotocol.io/specification/2025-06-18/server/tools).
type rpcMessage struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  struct {
		Name string `json:"name"`
	} `json:"params"`
}

// parseRPC reads body as one JSON-RPC 2.0 request or a batch of them; ok is false for
// anything else (not JSON, an empty batch, a message without "jsonrpc": "2.0" or a
// method).
func parseRPC(body []byte) (msgs []rpcMessage, ok bool) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 {
		return nil, false
	}
	if b[0] == '[' {
		if json.Unmarshal(b, &msgs) != nil || len(msgs) == 0 {
			return nil, false
		}
	} else {
		var m rpcMessage
		if json.Unmarshal(b, &m) != nil {
			return nil, false
		}
		msgs = []rpcMessage{m}
	}
	for _, m := range msgs {
		if m.JSONRPC != "2.0" || m.Method == "" {
			return nil, false
		}
	}
	return msgs, true
}

// bodyMatches reports whether every message of the body passes the rule's jsonrpc
// method list (exact names, or a prefix ending in "*") and mcpTools list (a tools/call
// must name one of them).
func (r *hrule) bodyMatches(msgs []rpcMessage) bool {
	for _, m := range msgs {
		if r.rpcMethods != nil && !slices.ContainsFunc(r.rpcMethods, func(p string) bool {
			if pre, ok := strings.CutSuffix(p, "*"); ok {
				return strings.HasPrefix(m.Method, pre)
			}
			return p == m.Method
		}) {
			return false
		}
		if r.mcpTools != nil && m.Method == "tools/call" && !slices.Contains(r.mcpTools, m.Params.Name) {
			return false
		}
	}
	return true
}
