package lifecycle_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

const testKey = "test-key-0123456789"

// client is a tiny lifecycle API client for the tests.
type client struct {
	t    testing.TB
	base string
	key  string
}

func newClient(t testing.TB, h *lctest.Harness) *client {
	return &client{t: t, base: h.HTTP.URL, key: testKey}
}

// do sends a request with the API key and returns the response and its body. body is
// JSON-encoded unless it is a string (sent as is).
func (c *client) do(method, path string, body any, hdr ...string) (*http.Response, []byte) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.key != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, c.key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp, b
}

// want checks the status and, for errors, the JSON envelope's code.
func (c *client) want(method, path string, body any, status int, code string) []byte {
	c.t.Helper()
	resp, b := c.do(method, path, body)
	if resp.StatusCode != status {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, status, b)
	}
	if resp.Header.Get("X-Request-ID") == "" {
		c.t.Errorf("%s %s: no X-Request-ID", method, path)
	}
	if status >= 300 {
		var e opensandbox.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.Code != code || e.Message == "" {
			c.t.Fatalf("%s %s: error body %q, want code %s and a message", method, path, b, code)
		}
	}
	return b
}

func (c *client) create(req map[string]any) lifecycle.Sandbox {
	c.t.Helper()
	b := c.want("POST", "/v1/sandboxes", req, http.StatusAccepted, "")
	var sb lifecycle.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		c.t.Fatal(err)
	}
	return sb
}

func (c *client) get(id string) lifecycle.Sandbox {
	c.t.Helper()
	b := c.want("GET", "/v1/sandboxes/"+id, nil, http.StatusOK, "")
	var sb lifecycle.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		c.t.Fatal(err)
	}
	return sb
}

// waitState polls the sandbox until it is in state (at most 90 s).
func (c *client) waitState(id string, state opensandbox.State) lifecycle.Sandbox {
	c.t.Helper()
	var sb lifecycle.Sandbox
	for range 900 {
		sb = c.get(id)
		if sb.Status.State == state {
			return sb
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("sandbox %s is %s, want %s", id, sb.Status.State, state)
	return sb
}

func baseReq(img string, md map[string]string) map[string]any {
	return map[string]any{
		"image":          map[string]any{"uri": img},
		"entrypoint":     []string{"tail", "-f", "/dev/null"},
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"},
		"metadata":       md,
		"env":            map[string]string{"FOO": "bar"},
		"extensions":     map[string]string{},
		"timeout":        600,
	}
}

// appServer is a small HTTP server run as a sandbox's entrypoint on port 8000: /sse
// sends one event, waits for /next, sends a second; /ws answers a WebSocket upgrade and
// echoes bytes; POST echoes the body; other GETs describe the request as JSON.
const appServer = `
import base64, hashlib, json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
nxt = threading.Event()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/sse":
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.send_header("Connection", "close"); self.end_headers()
            self.wfile.write(b"data: one\n\n"); self.wfile.flush()
            nxt.wait(60); nxt.clear()
            self.wfile.write(b"data: two\n\n"); self.wfile.flush()
            self.close_connection = True
        elif self.path == "/next":
            nxt.set(); self.reply(b"ok")
        elif self.path == "/ws":
            key = self.headers.get("Sec-WebSocket-Key", "")
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade"); self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
            while True:
                b = self.rfile.read1(4096)
                if not b: break
                self.wfile.write(b); self.wfile.flush()
            self.close_connection = True
        else:
            self.reply(json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode())
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0")); self.reply(self.rfile.read(n))
    def reply(self, b):
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

func TestRoutes(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)

	t.Run("health_open_and_auth", func(t *testing.T) {
		anon := &client{t: t, base: h.HTTP.URL}
		anon.want("GET", "/health", nil, http.StatusOK, "")
		anon.want("GET", "/v1/health", nil, http.StatusOK, "")
		anon.want("GET", "/v1/sandboxes", nil, http.StatusUnauthorized, "UNAUTHORIZED")
		wrong := &client{t: t, base: h.HTTP.URL, key: "nope"}
		wrong.want("GET", "/sandboxes", nil, http.StatusUnauthorized, "UNAUTHORIZED")
		resp, _ := anon.do("GET", "/v1/sandboxes", nil, "X-Request-ID", "rid-42")
		if got := resp.Header.Get("X-Request-ID"); got != "rid-42" {
			t.Errorf("X-Request-ID echoed as %q", got)
		}
	})
	t.Run("misc_routes", func(t *testing.T) {
		resp, b := c.do("POST", "/v1/metrics/events", `{"name":"x"}`)
		if resp.StatusCode != http.StatusNoContent || len(b) != 0 {
			t.Errorf("metrics/events: %d %q", resp.StatusCode, b)
		}
		c.want("GET", "/v1/nowhere", nil, http.StatusNotFound, "NOT_FOUND")
		c.want("GET", "/v1/snapshots", nil, http.StatusOK, "")
		c.want("GET", "/snapshots/s1", nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("DELETE", "/v1/snapshots/s1", nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("POST", "/v1/sandboxes/x/snapshots", map[string]any{}, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		req := baseReq(h.Image, nil)
		req["snapshotId"] = "snap1"
		delete(req, "image")
		c.want("POST", "/v1/sandboxes", req, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
	})
	t.Run("missing_ids", func(t *testing.T) {
		for _, r := range [][2]string{
			{"GET", "/v1/sandboxes/nosuch"}, {"DELETE", "/sandboxes/nosuch"},
			{"POST", "/v1/sandboxes/nosuch/pause"}, {"POST", "/v1/sandboxes/nosuch/resume"},
			{"GET", "/v1/sandboxes/nosuch/endpoints/44772"}, {"GET", "/sandboxes/nosuch/proxy/44772/ping"},
		} {
			c.want(r[0], r[1], nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		}
		c.want("PATCH", "/v1/sandboxes/nosuch/metadata", map[string]any{"a": "b"}, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		c.want("POST", "/v1/sandboxes/nosuch/renew-expiration", map[string]any{"expiresAt": time.Now().Add(time.Hour)}, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	})

	var main lifecycle.Sandbox
	t.Run("create_get", func(t *testing.T) {
		resp, b := c.do("POST", "/v1/sandboxes", baseReq(h.Image, map[string]string{"team": "a", "kind": "main"}))
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("create: %d %s", resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, &main); err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Location") != "/v1/sandboxes/"+main.ID {
			t.Errorf("Location %q", resp.Header.Get("Location"))
		}
		var raw map[string]any
		_ = json.Unmarshal(b, &raw)
		if _, has := raw["image"]; has {
			t.Errorf("create response carries image: %s", b)
		}
		if main.Status.State != opensandbox.Pending || main.ExpiresAt == nil || main.CreatedAt.IsZero() ||
			strings.Join(main.Entrypoint, " ") != "tail -f /dev/null" || main.Metadata["team"] != "a" {
			t.Fatalf("create response %s", b)
		}
		if d := main.ExpiresAt.Sub(main.CreatedAt); d != 600*time.Second {
			t.Errorf("expiresAt - createdAt = %s, want 600s", d)
		}
		got := c.waitState(main.ID, opensandbox.Running)
		if got.Image == nil || got.Image.URI != h.Image || strings.Join(got.Entrypoint, " ") != "tail -f /dev/null" {
			t.Errorf("get: %+v", got)
		}
	})
	if main.ID == "" {
		t.Fatal("no sandbox")
	}

	app := c.create(map[string]any{
		"image":          map[string]any{"uri": h.Image},
		"entrypoint":     []string{"python3", "-c", appServer},
		"resourceLimits": map[string]string{"cpu": "1", "memory": "512Mi"},
		"metadata":       map[string]string{"team": "b", "kind": "app"},
	})
	if app.ExpiresAt != nil {
		t.Errorf("manual-cleanup sandbox has expiresAt %s", app.ExpiresAt)
	}
	c.waitState(app.ID, opensandbox.Running)

	t.Run("list_filters_pagination", func(t *testing.T) {
		list := func(q string) lifecycle.ListResponse {
			b := c.want("GET", "/v1/sandboxes?"+q, nil, http.StatusOK, "")
			var l lifecycle.ListResponse
			if err := json.Unmarshal(b, &l); err != nil {
				t.Fatal(err)
			}
			return l
		}
		ids := func(l lifecycle.ListResponse) string {
			var s []string
			for _, it := range l.Items {
				s = append(s, it.ID)
			}
			return strings.Join(s, ",")
		}
		if l := list(""); l.Pagination.TotalItems != 2 || ids(l) != app.ID+","+main.ID {
			t.Errorf("all: %s %+v", ids(l), l.Pagination)
		}
		if l := list("state=running&state=PAUSED"); l.Pagination.TotalItems != 2 {
			t.Errorf("states OR: %+v", l.Pagination)
		}
		if l := list("state=Paused"); l.Pagination.TotalItems != 0 {
			t.Errorf("state Paused: %+v", l.Pagination)
		}
		md := url.QueryEscape("team=a&kind=main")
		if l := list("metadata=" + md); ids(l) != main.ID {
			t.Errorf("metadata AND: %s", ids(l))
		}
		if l := list("metadata=" + url.QueryEscape("team=a&kind=app")); len(l.Items) != 0 {
			t.Errorf("metadata AND mismatch: %s", ids(l))
		}
		l := list("page=2&pageSize=1")
		if ids(l) != main.ID || l.Pagination != (lifecycle.Pagination{Page: 2, PageSize: 1, TotalItems: 2, TotalPages: 2, HasNextPage: false}) {
			t.Errorf("page 2: %s %+v", ids(l), l.Pagination)
		}
		if l := list("page=1&pageSize=1"); !l.Pagination.HasNextPage {
			t.Errorf("page 1: %+v", l.Pagination)
		}
		c.want("GET", "/v1/sandboxes?page=0", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes?pageSize=x", nil, http.StatusBadRequest, "INVALID_REQUEST")
	})

	t.Run("endpoints", func(t *testing.T) {
		for _, port := range []string{"44772", "18080", "8000"} {
			for _, q := range []string{"", "?use_server_proxy=true", "?use_server_proxy=false"} {
				b := c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/"+port+q, nil, http.StatusOK, "")
				var ep lifecycle.Endpoint
				if err := json.Unmarshal(b, &ep); err != nil {
					t.Fatal(err)
				}
				want := strings.TrimPrefix(h.HTTP.URL, "http://") + "/sandboxes/" + main.ID + "/proxy/" + port
				if ep.Endpoint != want {
					t.Errorf("endpoint %q, want %q", ep.Endpoint, want)
				}
				// execd and the egress API are never public: their endpoints carry the
				// sandbox's access token, which the SDK sends back; other ports are public.
				if tok := ep.Headers[lifecycle.AccessTokenHeader]; (port == "8000") != (tok == "") || tok != "" && len(tok) != 64 {
					t.Errorf("port %s: endpoint headers %v", port, ep.Headers)
				}
			}
		}
		c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/8080?expires="+strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10), nil, http.StatusNotImplemented, "NOT_IMPLEMENTED")
		c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/8080?expires=soon", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/8080?expires=4102444800&use_server_proxy=true", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/0", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+main.ID+"/endpoints/70000", nil, http.StatusBadRequest, "INVALID_REQUEST")
	})

	t.Run("proxy", func(t *testing.T) { testProxy(t, c, h, app.ID) })

	t.Run("metadata_patch", func(t *testing.T) {
		b := c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{"team":null,"new":"x","kind":"main2","absent":null}`, http.StatusOK, "")
		var sb lifecycle.Sandbox
		_ = json.Unmarshal(b, &sb)
		if len(sb.Metadata) != 2 || sb.Metadata["new"] != "x" || sb.Metadata["kind"] != "main2" || sb.Image == nil {
			t.Errorf("patched: %s", b)
		}
		c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{}`, http.StatusOK, "")
		c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{"opensandbox.io/x":"1"}`, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{"airlock.dev/x":"1"}`, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{"ok":"bad value!"}`, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("PATCH", "/v1/sandboxes/"+main.ID+"/metadata", `{"ok":`, http.StatusBadRequest, "INVALID_JSON")
		if got := c.get(main.ID).Metadata; len(got) != 2 || got["new"] != "x" {
			t.Errorf("after rejected patches: %v", got)
		}
	})

	t.Run("renew", func(t *testing.T) {
		at := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
		b := c.want("POST", "/v1/sandboxes/"+main.ID+"/renew-expiration", map[string]any{"expiresAt": at}, http.StatusOK, "")
		var rr lifecycle.RenewResponse
		_ = json.Unmarshal(b, &rr)
		if !rr.ExpiresAt.Equal(at) || !c.get(main.ID).ExpiresAt.Equal(at) {
			t.Errorf("renewed to %s, want %s", rr.ExpiresAt, at)
		}
		c.want("POST", "/v1/sandboxes/"+main.ID+"/renew-expiration", map[string]any{"expiresAt": time.Now().Add(-time.Minute)}, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("POST", "/v1/sandboxes/"+main.ID+"/renew-expiration", `{}`, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("POST", "/v1/sandboxes/"+main.ID+"/renew-expiration", `{"expiresAt":"tomorrow"}`, http.StatusBadRequest, "INVALID_JSON")
		c.want("POST", "/v1/sandboxes/"+app.ID+"/renew-expiration", map[string]any{"expiresAt": at}, http.StatusConflict, "INVALID_STATE")
	})

	t.Run("pause_resume", func(t *testing.T) {
		c.want("POST", "/v1/sandboxes/"+main.ID+"/resume", nil, http.StatusConflict, "INVALID_STATE")
		resp, b := c.do("POST", "/v1/sandboxes/"+main.ID+"/pause", nil)
		if resp.StatusCode != http.StatusAccepted || len(b) != 0 || resp.Header.Get("Content-Length") != "0" {
			t.Fatalf("pause: %d %q cl=%q", resp.StatusCode, b, resp.Header.Get("Content-Length"))
		}
		c.waitState(main.ID, opensandbox.Paused)
		c.want("POST", "/v1/sandboxes/"+main.ID+"/pause", nil, http.StatusConflict, "INVALID_STATE")
		c.want("GET", "/sandboxes/"+main.ID+"/proxy/44772/ping", nil, http.StatusConflict, "INVALID_STATE")
		c.want("POST", "/sandboxes/"+main.ID+"/resume", nil, http.StatusAccepted, "")
		c.waitState(main.ID, opensandbox.Running)
		c.want("GET", "/sandboxes/"+main.ID+"/proxy/44772/ping", nil, http.StatusOK, "")
		// Delete works on a paused sandbox too.
		c.want("POST", "/v1/sandboxes/"+app.ID+"/pause", nil, http.StatusAccepted, "")
		c.waitState(app.ID, opensandbox.Paused)
	})

	t.Run("delete", func(t *testing.T) {
		for _, id := range []string{main.ID, app.ID} {
			resp, b := c.do("DELETE", "/v1/sandboxes/"+id, nil)
			if resp.StatusCode != http.StatusNoContent || len(b) != 0 {
				t.Fatalf("delete %s: %d %s", id, resp.StatusCode, b)
			}
			c.want("GET", "/v1/sandboxes/"+id, nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		}
		if n := countContainers(t, h); n != 0 {
			t.Errorf("%d containers left after delete", n)
		}
		if n, _ := h.Store.Count(); n != 0 {
			t.Errorf("%d store records left after delete", n)
		}
	})
}

func countContainers(t testing.TB, h *lctest.Harness) int {
	t.Helper()
	insts, err := h.Runtime.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return len(insts)
}

func testProxy(t *testing.T, c *client, h *lctest.Harness, id string) {
	base := "/sandboxes/" + id + "/proxy/8000"
	// The app starts after execd; wait for it (bounded).
	var b []byte
	for i := range 300 {
		var resp *http.Response
		resp, b = c.do("GET", "/v1"+base+"/hello?x=1%2F2", nil, "Connection", "keep-alive, X-Hop", "X-Hop", "1", "X-Custom", "kept")
		if resp.StatusCode == http.StatusOK {
			break
		}
		if i == 299 {
			t.Fatalf("app never answered: %d %s", resp.StatusCode, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var seen struct {
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(b, &seen); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if seen.Path != "/hello?x=1%2F2" {
		t.Errorf("upstream path %q", seen.Path)
	}
	if _, has := seen.Headers["open-sandbox-api-key"]; has {
		t.Errorf("API key reached the sandbox")
	}
	if _, has := seen.Headers["x-hop"]; has {
		t.Errorf("hop-by-hop header X-Hop reached the sandbox")
	}
	if seen.Headers["x-custom"] != "kept" {
		t.Errorf("end-to-end header lost: %v", seen.Headers)
	}

	// A POST body both ways.
	payload := strings.Repeat("airlock-", 10000)
	if resp, b := c.do("POST", base+"/echo", payload); resp.StatusCode != 200 || string(b) != payload {
		t.Errorf("echo: %d, %d bytes", resp.StatusCode, len(b))
	}

	// SSE: the first event must arrive before the app is told to send the second.
	req, _ := http.NewRequest("GET", h.HTTP.URL+base+"/sse", nil)
	req.Header.Set(opensandbox.HeaderAPIKey, testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("sse content type %q", resp.Header.Get("Content-Type"))
	}
	rd := bufio.NewReader(resp.Body)
	readEvent := func() string {
		done := make(chan string, 1)
		go func() {
			var ev strings.Builder
			for {
				line, err := rd.ReadString('\n')
				if err != nil {
					done <- "error: " + err.Error()
					return
				}
				if line == "\n" {
					done <- ev.String()
					return
				}
				ev.WriteString(strings.TrimSpace(line))
			}
		}()
		select {
		case ev := <-done:
			return ev
		case <-time.After(30 * time.Second):
			return "no event (buffered by the proxy?)"
		}
	}
	if ev := readEvent(); ev != "data: one" {
		t.Fatalf("first event %q", ev)
	}
	c.want("GET", base+"/next", nil, http.StatusOK, "")
	if ev := readEvent(); ev != "data: two" {
		t.Fatalf("second event %q", ev)
	}

	// WebSocket upgrade through the proxy, bytes echoed both ways.
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.HTTP.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /v1%s/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOPEN-SANDBOX-API-KEY: %s\r\n\r\n", base, testKey)
	br := bufio.NewReader(conn)
	wsResp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if wsResp.StatusCode != http.StatusSwitchingProtocols || wsResp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("upgrade: %s %v", wsResp.Status, wsResp.Header)
	}
	if _, err := conn.Write([]byte("frame-bytes")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("frame-bytes"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "frame-bytes" {
		t.Fatalf("websocket echo %q %v", got, err)
	}
}
