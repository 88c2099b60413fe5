package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// ptyAPI records what the console sends to lifecycle for the terminal and answers like
// execd behind the server proxy (no real upgrade: the console passes answers through).
type ptyAPI struct {
	mu   sync.Mutex
	reqs []*http.Request
	body []string
}

func (a *ptyAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.reqs = append(a.reqs, r)
	a.body = append(a.body, string(b))
	a.mu.Unlock()
	switch {
	case r.URL.Path == "/v1/sandboxes/sb1/endpoints/44772":
		opensandbox.WriteJSON(w, 200, map[string]any{"endpoint": "x/sandboxes/sb1/proxy/44772",
			"headers": map[string]string{opensandbox.HeaderExecdAccessToken: "execd-tok"}})
	case r.Method == "POST":
		opensandbox.WriteJSON(w, 201, map[string]string{"session_id": "s1"})
	default:
		w.WriteHeader(200)
	}
}

func (a *ptyAPI) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.reqs) == 0 {
		t.Fatal("nothing reached the API")
	}
	return a.reqs[len(a.reqs)-1], a.body[len(a.body)-1]
}

func (a *ptyAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reqs)
}

func newTermHarness(t *testing.T, key string) (*harness, *ptyAPI) {
	api := &ptyAPI{}
	con, err := New(Config{API: api, APIKey: key, SessionTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, con: con, srv: httptest.NewServer(con)}
	t.Cleanup(h.srv.Close)
	return h, api
}

// TestTerminalRoutes: the terminal's routes reach execd's PTY API through lifecycle's
// server proxy (/sandboxes/{id}/proxy/44772/pty…) with the session's key, or without a
// key (--no-auth) with the sandbox's credential from its endpoint; writes need the CSRF
// token, the WebSocket a same-origin Origin; the browser's Origin and cookie never go
// upstream, nor query parameters execd does not read.
func TestTerminalRoutes(t *testing.T) {
	h, api := newTermHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	tok := h.csrf(c)
	same := map[string]string{"Origin": h.srv.URL, CSRFHeader: tok}

	r, b := h.do(c, "POST", "/console/api/sandboxes/sb1/pty", "", same)
	up, body := api.last(t)
	if r.StatusCode != 201 || string(b) != `{"session_id":"s1"}`+"\n" && string(b) != `{"session_id":"s1"}` {
		t.Errorf("create: %d %s", r.StatusCode, b)
	}
	if up.Method != "POST" || up.URL.Path != "/sandboxes/sb1/proxy/44772/pty" || body != "{}" ||
		up.Header.Get(opensandbox.HeaderAPIKey) != testKey || up.Header.Get("Content-Type") != "application/json" {
		t.Errorf("create upstream: %s %s %q %v", up.Method, up.URL, body, up.Header)
	}
	n := api.count()
	if r, _ := h.do(c, "POST", "/console/api/sandboxes/sb1/pty", "{}", map[string]string{"Origin": h.srv.URL}); r.StatusCode != 403 || api.count() != n {
		t.Errorf("create without the CSRF token: %d, reached the API: %v", r.StatusCode, api.count() != n)
	}
	h.do(c, "DELETE", "/console/api/sandboxes/sb1/pty/s1", "", same)
	if up, _ := api.last(t); up.Method != "DELETE" || up.URL.Path != "/sandboxes/sb1/proxy/44772/pty/s1" {
		t.Errorf("delete upstream: %s %s", up.Method, up.URL)
	}

	ws := map[string]string{"Origin": h.srv.URL, "Connection": "Upgrade", "Upgrade": "websocket",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}
	h.do(c, "GET", "/console/api/sandboxes/sb1/pty/s1/ws?since=5&takeover=1&other=x", "", ws)
	up, _ = api.last(t)
	if up.Method != "GET" || up.URL.Path != "/sandboxes/sb1/proxy/44772/pty/s1/ws" || up.URL.RawQuery != "since=5&takeover=1" ||
		up.Header.Get("Upgrade") != "websocket" || up.Header.Get("Sec-WebSocket-Key") == "" ||
		up.Header.Get("Origin") != "" || up.Header.Get("Cookie") != "" || up.Header.Get(opensandbox.HeaderAPIKey) != testKey {
		t.Errorf("websocket upstream: %s %s %v", up.Method, up.URL, up.Header)
	}
	n = api.count()
	for name, origin := range map[string]string{"foreign": "http://evil.example", "none": ""} {
		hdr := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Origin": origin}
		if r, _ := h.do(c, "GET", "/console/api/sandboxes/sb1/pty/s1/ws", "", hdr); r.StatusCode != 403 {
			t.Errorf("websocket with %s Origin: %d", name, r.StatusCode)
		}
	}
	if r, _ := h.do(h.client(), "GET", "/console/api/sandboxes/sb1/pty/s1/ws", "", ws); r.StatusCode != 401 {
		t.Errorf("websocket without a session: %d", r.StatusCode)
	}
	if api.count() != n {
		t.Error("a refused websocket reached the API")
	}

	t.Run("no_auth", func(t *testing.T) {
		h, api := newTermHarness(t, "")
		c := h.client()
		h.login(c, "")
		h.do(c, "POST", "/console/api/sandboxes/sb1/pty", "{}", map[string]string{"Origin": h.srv.URL, CSRFHeader: h.csrf(c)})
		up, _ := api.last(t)
		if up.URL.Path != "/sandboxes/sb1/proxy/44772/pty" || up.Header.Get(opensandbox.HeaderExecdAccessToken) != "execd-tok" ||
			up.Header.Get(opensandbox.HeaderAPIKey) != "" {
			t.Errorf("no-auth upstream: %s %v", up.URL, up.Header)
		}
	})
}
