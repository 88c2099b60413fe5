package conformance_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

const apiKey = "conformance-key"

// client talks to one lifecycle replica's API.
type client struct {
	t    testing.TB
	base string
}

func (c *client) do(method, path string, body any, hdr ...string) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set(opensandbox.HeaderAPIKey, apiKey)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// want does the request and fails unless it answers status; it returns the body.
func (c *client) want(method, path string, body any, status int) []byte {
	c.t.Helper()
	got, b := c.do(method, path, body)
	if got != status {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, got, b, status)
	}
	return b
}

func (c *client) create(req map[string]any) string {
	c.t.Helper()
	var sb lifecycle.Sandbox
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes", req, http.StatusAccepted), &sb); err != nil || sb.ID == "" {
		c.t.Fatalf("create answer: %v", err)
	}
	return sb.ID
}

func (c *client) get(id string) (lifecycle.Sandbox, int) {
	c.t.Helper()
	st, b := c.do("GET", "/v1/sandboxes/"+id, nil)
	var sb lifecycle.Sandbox
	if st == http.StatusOK {
		if err := json.Unmarshal(b, &sb); err != nil {
			c.t.Fatal(err)
		}
	}
	return sb, st
}

// waitState waits (at most 90 s) until sandbox id is in state.
func (c *client) waitState(id string, state opensandbox.State) lifecycle.Sandbox {
	c.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		sb, st := c.get(id)
		if st == http.StatusOK && sb.Status.State == state {
			return sb
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("sandbox %s: status %d state %+v, want %s", id, st, sb.Status, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits (at most 60 s) until sandbox id answers 404.
func (c *client) waitGone(id string) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, st := c.get(id); st == http.StatusNotFound {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("sandbox %s still there", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run runs command in sandbox id through lifecycle's server proxy, with the headers
// the endpoint of execd's port names (as the SDKs do), and returns its stdout.
func (c *client) run(id, command string) string {
	c.t.Helper()
	var ep lifecycle.Endpoint
	if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=true", nil, http.StatusOK), &ep); err != nil {
		c.t.Fatal(err)
	}
	var hdr []string
	for k, v := range ep.Headers {
		hdr = append(hdr, k, v)
	}
	st, b := c.do("POST", "/sandboxes/"+id+"/proxy/44772/command", map[string]any{"command": command}, hdr...)
	if st != http.StatusOK {
		c.t.Fatalf("command %q in %s: %d %s", command, id, st, b)
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		var ev struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "stdout" {
			out.WriteString(ev.Text)
		}
	}
	return strings.TrimSpace(out.String())
}

// metric returns the value of an unlabelled metric from the replica's /metrics.
func (c *client) metric(name string) float64 {
	c.t.Helper()
	_, b := c.do("GET", "/metrics", nil)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if err := json.Unmarshal([]byte(strings.TrimSpace(rest)), &v); err == nil {
				return v
			}
		}
	}
	return 0
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
