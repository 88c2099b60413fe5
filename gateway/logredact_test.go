package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/internal/testupstream"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestCaddyDebugLogRedactsCredentials runs the gateway with Caddy's log at DEBUG into a
// file and sends credentials through it: the API key the gateway adds when it forwards
// the egress API, and execd's token, which reaches the sandbox (reverse_proxy's
// "upstream roundtrip" debug record prints the upstream request's headers). No value
// may appear in the log.
func TestCaddyDebugLogRedactsCredentials(t *testing.T) {
	const (
		forwardKey = "gateway-forward-key-must-not-be-logged"
		execdToken = "execd-token-must-not-be-logged"
	)
	lc := httptest.NewServer(testupstream.Handler()) // stands in for lifecycle and the sandbox app
	t.Cleanup(lc.Close)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	edit := func(b []byte) []byte {
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		def := cfg["logging"].(map[string]any)["logs"].(map[string]any)["default"].(map[string]any)
		def["writer"] = map[string]any{"output": "file", "filename": logPath, "roll": false}
		out, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	e := newEnvEdit(t, func(c *Config) {
		withAPIKey(c)
		c.CaddyLogLevel = "DEBUG"
		c.EgressAPIDial = strings.TrimPrefix(lc.URL, "http://")
		c.EgressAPIHeader = http.Header{opensandbox.HeaderAPIKey: {forwardKey}}
	}, edit, nil)
	// The hub is up: wait for the first snapshot (newEnvEdit waits only without before).
	addr, port := splitHostPort(t, lc.URL)
	sb := runningSandbox("logged", addr)
	sb.Access.TokenSHA256 = accesstoken.Sum(testAccessToken).String()
	e.put(sb)

	resp := e.do("GET", "", "/sandboxes/logged/proxy/18080/policy", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("egress API: status %d: %s", resp.StatusCode, b)
	}
	resp = e.do("GET", "", "/sandboxes/logged/proxy/"+itoa(port)+"/x", http.Header{"X-Execd-Access-Token": {execdToken}})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("user port: status %d: %s", resp.StatusCode, b)
	}

	var log string
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		log = string(b)
		if strings.Count(log, "upstream roundtrip") >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Count(log, "upstream roundtrip") < 2 {
		t.Fatalf("the debug log has no upstream roundtrip records:\n%s", log)
	}
	for _, secret := range []string{forwardKey, execdToken, testAPIKey, testAccessToken} {
		if strings.Contains(log, secret) {
			t.Errorf("Caddy's log prints the credential %q", secret)
		}
	}
	if !strings.Contains(log, redactedLogValue) {
		t.Errorf("no %s in the log: the headers were not logged at all?\n%s", redactedLogValue, log)
	}
}
