package lifecycle_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// sandboxAddr returns the container address of sandbox id on the Airlock network.
func sandboxAddr(t *testing.T, h *lctest.Harness, id string) string {
	t.Helper()
	insts, err := h.Runtime.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.SandboxID == id && in.Address.IsValid() {
			return in.Address.String()
		}
	}
	t.Fatalf("sandbox %s has no address", id)
	return ""
}

// TestExecdToken: every sandbox's execd requires its own token (derived from the
// server's execd key), so a process that reaches the container's address (another
// sandbox, a host process) gets 401 on everything but GET /ping, the hold's release
// included. The token reaches neither the user's environment nor a file in the sandbox:
// execd's command line carries its SHA-256 only.
// The endpoint of port 44772 lists it under X-EXECD-ACCESS-TOKEN, and the server proxy
// accepts it (alone, as OpenSandbox's execd clients send it) for that port of that
// sandbox only.
func TestExecdToken(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	anon := &client{t: t, base: h.HTTP.URL}
	a := c.create(baseReq(h.Image, nil))
	b := c.create(baseReq(h.Image, nil))
	c.waitState(a.ID, opensandbox.Running)
	c.waitState(b.ID, opensandbox.Running)
	key, err := execdtoken.LoadOrCreate(filepath.Join(h.StateDir, "execd-key"))
	if err != nil {
		t.Fatal(err)
	}
	tokA, tokB := key.Derive(a.ID), key.Derive(b.ID)

	// Straight to the container: only /ping without the token.
	direct := &client{t: t, base: "http://" + net.JoinHostPort(sandboxAddr(t, h, a.ID), strconv.Itoa(opensandbox.ExecdPort))}
	if st := direct.status("GET", "/ping"); st != http.StatusOK {
		t.Errorf("direct /ping: %d", st)
	}
	for _, r := range []struct{ method, path, tok string }{
		{"GET", "/command/status/x", ""},
		{"GET", "/command/status/x", tokB},
		{"POST", opensandbox.ReleasePath, ""},
		{"GET", "/files/info?path=/etc/hostname", "wrong"},
	} {
		if st := direct.status(r.method, r.path, opensandbox.HeaderExecdAccessToken, r.tok); st != http.StatusUnauthorized {
			t.Errorf("direct %s %s with token %q: %d, want 401", r.method, r.path, r.tok, st)
		}
	}
	if st := direct.status("GET", "/command/status/x", opensandbox.HeaderExecdAccessToken, tokA); st != http.StatusNotFound {
		t.Errorf("direct with the sandbox's token: %d, want execd's 404", st)
	}

	// The endpoint lists it; the server proxy takes it alone, for this sandbox only.
	ep := c.endpoint(a.ID, "44772")
	if ep.Headers[lifecycle.ExecdTokenHeader] != tokA {
		t.Fatalf("execd endpoint headers %v: want %s", ep.Headers, lifecycle.ExecdTokenHeader)
	}
	if ep := c.endpoint(a.ID, "18080"); ep.Headers[lifecycle.ExecdTokenHeader] != "" {
		t.Errorf("egress API endpoint lists the execd token: %v", ep.Headers)
	}
	proxy := "/sandboxes/" + a.ID + "/proxy/44772"
	if st := anon.status("GET", proxy+"/command/status/x", opensandbox.HeaderExecdAccessToken, tokA); st != http.StatusNotFound {
		t.Errorf("server proxy with X-EXECD-ACCESS-TOKEN only: %d, want execd's 404", st)
	}
	for _, tok := range []string{tokB, "wrong"} {
		if st := anon.status("GET", proxy+"/command/status/x", opensandbox.HeaderExecdAccessToken, tok); st != http.StatusUnauthorized {
			t.Errorf("server proxy with another execd token %q: %d, want 401", tok, st)
		}
	}
	if st := anon.status("GET", "/sandboxes/"+b.ID+"/proxy/44772/command/status/x", opensandbox.HeaderExecdAccessToken, tokA); st != http.StatusUnauthorized {
		t.Errorf("sandbox A's execd token on sandbox B: %d, want 401", st)
	}

	// Inside: no token file, nothing in the environment of PID 1 or of commands.
	resp, body := c.do("POST", proxy+"/command", map[string]any{
		"command": "ls -A /opt/airlock/run; cat /proc/1/environ | tr '\\0' '\\n'; env; cat /proc/1/cmdline | tr '\\0' ' '",
	})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "execution_complete") {
		t.Fatalf("command: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), tokA) || strings.Contains(string(body), "execd-token\"") {
		t.Errorf("the token is readable inside the sandbox: %s", body)
	}
	// execd knows the token's SHA-256 only, and nothing was copied in for it.
	sum := sha256.Sum256([]byte(tokA))
	want := "--access-token-sha256 " + hex.EncodeToString(sum[:])
	var sawCmdline bool
	for _, line := range strings.Split(string(body), "\n") {
		var ev struct{ Type, Text string }
		if json.Unmarshal([]byte(line), &ev) == nil && strings.Contains(ev.Text, want) {
			sawCmdline = true
		}
	}
	if !sawCmdline {
		t.Errorf("execd was not started with %s: %s", want, body)
	}
	if strings.Contains(string(body), "--access-token-file") {
		t.Errorf("execd was started with a token file: %s", body)
	}
}

// TestServerProxyUpstreamErrorHidesAddress: a 502 of the server proxy says that the
// sandbox did not answer, never where the proxy dialled.
func TestServerProxyUpstreamErrorHidesAddress(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	sb := c.create(baseReq(h.Image, nil))
	c.waitState(sb.ID, opensandbox.Running)
	addr := sandboxAddr(t, h, sb.ID)
	resp, body := c.do("GET", "/sandboxes/"+sb.ID+"/proxy/9/", nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("closed port: %d %s", resp.StatusCode, body)
	}
	var e opensandbox.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Code != "BAD_GATEWAY" || e.RequestID == "" {
		t.Fatalf("body %s", body)
	}
	if strings.Contains(string(body), addr) || strings.Contains(string(body), "dial") || strings.Contains(string(body), "refused") {
		t.Errorf("the 502 body carries the dial error: %s", body)
	}
}
