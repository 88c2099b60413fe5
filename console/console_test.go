package console

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

const testKey = "ak_test-key"

// fakeAPI stands in for lifecycle's handler: it checks the key and records writes.
type fakeAPI struct {
	key    string
	writes atomic.Int32
	mu     sync.Mutex
	keys   []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("OPEN-SANDBOX-API-KEY"))
	f.mu.Unlock()
	if f.key != "" && r.Header.Get("OPEN-SANDBOX-API-KEY") != f.key {
		writeError(w, 401, "UNAUTHORIZED", "missing or wrong key")
		return
	}
	switch {
	case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
		opensandbox.WriteJSON(w, 200, map[string]any{"items": []any{map[string]any{"id": "sb1", "status": map[string]any{"state": "Running"},
			"metadata": map[string]string{}, "createdAt": time.Now()}}, "pagination": map[string]any{"totalItems": 1}})
	case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb1":
		opensandbox.WriteJSON(w, 200, map[string]any{"id": "sb1", "status": map[string]any{"state": "Running"}})
	case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb1/policy":
		opensandbox.WriteJSON(w, 200, map[string]any{"sandboxId": "sb1", "version": 3, "name": "python-packages",
			"policy": json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org","ports":[443]}]}`)})
	case r.Method == "POST" && r.URL.Path == "/v1/sandboxes/sb1/signed-urls/revoke":
		f.writes.Add(1)
		opensandbox.WriteJSON(w, 200, map[string]any{"signedUrlEpoch": 1})
	case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
		f.writes.Add(1)
		writeError(w, 400, "INVALID_REQUEST", "image.uri is required")
	case r.Method == "DELETE" && r.URL.Path == "/v1/sandboxes/sb1":
		f.writes.Add(1)
		w.WriteHeader(204)
	default:
		writeError(w, 404, "NOT_FOUND", "no route "+r.Method+" "+r.URL.Path)
	}
}

type harness struct {
	t   *testing.T
	api *fakeAPI
	con *Console
	srv *httptest.Server
	now atomic.Pointer[time.Time]
	dir string
	aw  *audit.Writer
}

func newHarness(t *testing.T, key string) *harness {
	t.Helper()
	h := &harness{t: t, api: &fakeAPI{key: key}, dir: t.TempDir()}
	n := time.Now()
	h.now.Store(&n)
	var err error
	if h.aw, err = audit.New(audit.Config{Dir: h.dir}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.aw.Close() })
	h.con, err = New(Config{API: h.api, APIKey: key, AuditDir: h.dir, SessionTTL: time.Hour,
		Now: func() time.Time { return *h.now.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(h.con)
	t.Cleanup(h.srv.Close)
	return h
}

func (h *harness) advance(d time.Duration) {
	n := h.now.Load().Add(d)
	h.now.Store(&n)
}

// client is a browser-like client with a cookie jar that does not follow redirects.
func (h *harness) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// login posts the key as the login form does (same-origin headers).
func (h *harness) login(c *http.Client, key string) *http.Response {
	req, _ := http.NewRequest("POST", h.srv.URL+"/console/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", h.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := c.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// csrf reads the page's CSRF token.
func (h *harness) csrf(c *http.Client) string {
	resp, err := c.Get(h.srv.URL + "/console/")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, rest, ok := strings.Cut(string(b), `name="csrf-token" content="`)
	if !ok {
		h.t.Fatalf("no csrf token in the page (%d): %s", resp.StatusCode, b)
	}
	tok, _, _ := strings.Cut(rest, `"`)
	return tok
}

func (h *harness) do(c *http.Client, method, path, body string, hdr map[string]string) (*http.Response, []byte) {
	req, _ := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestLoginSetsSessionCookie(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	resp := h.login(c, testKey)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	cks := resp.Cookies()
	if len(cks) != 1 {
		t.Fatalf("cookies %v", cks)
	}
	ck := cks[0]
	if ck.Name != CookieName || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/console" ||
		ck.Secure || ck.MaxAge != 0 || len(ck.Value) < 40 || strings.Contains(ck.Value, testKey) {
		t.Errorf("cookie %+v", ck)
	}
	// The page carries a CSRF token and never the key.
	r, body := h.do(c, "GET", "/console/", "", nil)
	if r.StatusCode != 200 || strings.Contains(string(body), testKey) || !strings.Contains(string(body), "csrf-token") {
		t.Errorf("page %d: key leaked or no token", r.StatusCode)
	}
	if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
}

func TestWrongKeyRejected(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	req, _ := http.NewRequest("POST", h.srv.URL+"/console/login", strings.NewReader("key=nope"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", h.srv.URL)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "Wrong API key") || len(resp.Cookies()) != 0 {
		t.Errorf("wrong key: %d cookies %v body %s", resp.StatusCode, resp.Cookies(), b)
	}
	if r, _ := h.do(c, "GET", "/console/api/sandboxes", "", nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("API without a session: %d", r.StatusCode)
	}
	if r, _ := h.do(c, "GET", "/console/", "", nil); r.StatusCode != http.StatusSeeOther ||
		!strings.HasPrefix(r.Header.Get("Location"), "/console/login?next=") {
		t.Errorf("page without a session: %d %s", r.StatusCode, r.Header.Get("Location"))
	}
}

func TestLoginRateLimited(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	for range loginPerClient {
		if r := h.login(c, "wrong"); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("failed login: %d", r.StatusCode)
		}
	}
	if r := h.login(c, testKey); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("login after %d failures: %d, want 429", loginPerClient, r.StatusCode)
	}
	h.advance(time.Minute)
	if r := h.login(c, testKey); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("login a minute later: %d", r.StatusCode)
	}
}

func TestSessionExpires(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	if r, _ := h.do(c, "GET", "/console/api/sandboxes", "", nil); r.StatusCode != 200 {
		t.Fatalf("fresh session: %d", r.StatusCode)
	}
	h.advance(time.Hour)
	r, b := h.do(c, "GET", "/console/api/sandboxes", "", nil)
	if r.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "SESSION_EXPIRED") {
		t.Errorf("expired session API: %d %s", r.StatusCode, b)
	}
	r, _ = h.do(c, "GET", "/console/sandboxes/sb1", "", nil)
	if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "expired=1") ||
		!strings.Contains(loc, "next=%2Fconsole%2Fsandboxes%2Fsb1") {
		t.Errorf("expired session page: %d %s", r.StatusCode, loc)
	}
}

func TestLogout(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	tok := h.csrf(c)
	r, _ := h.do(c, "POST", "/console/logout", "", map[string]string{CSRFHeader: tok, "Origin": h.srv.URL})
	if r.StatusCode != http.StatusNoContent {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	if r, _ := h.do(c, "GET", "/console/api/sandboxes", "", nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("after logout: %d", r.StatusCode)
	}
}

// TestWritesNeedCSRFAndSameOrigin: a write without the token, with a wrong one, from a
// foreign origin or cross-site is 403 CSRF_FAILED and never reaches the API.
func TestWritesNeedCSRFAndSameOrigin(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	tok := h.csrf(c)
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"NoToken", map[string]string{"Origin": h.srv.URL}},
		{"WrongToken", map[string]string{"Origin": h.srv.URL, CSRFHeader: tok + "x"}},
		{"ForeignOrigin", map[string]string{"Origin": "http://evil.example", CSRFHeader: tok}},
		{"NullOrigin", map[string]string{"Origin": "null", CSRFHeader: tok}},
		{"CrossSite", map[string]string{"Sec-Fetch-Site": "cross-site", CSRFHeader: tok}},
		{"SameSite", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": h.srv.URL, CSRFHeader: tok}},
		{"NoOriginAtAll", map[string]string{CSRFHeader: tok}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, b := h.do(c, "DELETE", "/console/api/v1/sandboxes/sb1", "", tc.hdr)
			var e struct{ Code, Message string }
			json.Unmarshal(b, &e)
			if r.StatusCode != http.StatusForbidden || e.Code != "CSRF_FAILED" || e.Message == "" {
				t.Errorf("%d %s", r.StatusCode, b)
			}
		})
	}
	if n := h.api.writes.Load(); n != 0 {
		t.Fatalf("%d refused writes reached the API", n)
	}
	r, _ := h.do(c, "DELETE", "/console/api/v1/sandboxes/sb1", "", map[string]string{"Origin": h.srv.URL, "Sec-Fetch-Site": "same-origin", CSRFHeader: tok})
	if r.StatusCode != http.StatusNoContent || h.api.writes.Load() != 1 {
		t.Errorf("a proper write: %d, %d writes", r.StatusCode, h.api.writes.Load())
	}
	// A cross-origin login is refused too (login CSRF).
	req, _ := http.NewRequest("POST", h.srv.URL+"/console/login", strings.NewReader("key="+testKey))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	resp, err := h.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Errorf("cross-origin login: %d %v", resp.StatusCode, resp.Cookies())
	}
}

func TestOriginCheck(t *testing.T) {
	o, err := newOriginCheck([]string{"https://airlock.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, host, origin, site string
		ok                       bool
	}{
		{"SameOrigin", "127.0.0.1:8080", "http://127.0.0.1:8080", "same-origin", true},
		{"OriginOnly", "127.0.0.1:8080", "http://127.0.0.1:8080", "", true},
		{"FetchMetadataOnly", "127.0.0.1:8080", "", "same-origin", true},
		{"CaseInsensitiveHost", "LOCALHOST:8080", "http://localhost:8080", "", true},
		{"Trusted", "10.0.0.1:8080", "https://airlock.example.com", "same-origin", true},
		{"OtherPort", "127.0.0.1:8080", "http://127.0.0.1:8081", "", false},
		{"OtherScheme", "127.0.0.1:8080", "https://127.0.0.1:8080", "", false},
		{"Foreign", "127.0.0.1:8080", "http://evil.example", "", false},
		{"CrossSite", "127.0.0.1:8080", "http://127.0.0.1:8080", "cross-site", false},
		{"UserInitiated", "127.0.0.1:8080", "", "none", false},
		{"Neither", "127.0.0.1:8080", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://"+tc.host+"/console/api/v1/sandboxes", nil)
			r.Host = tc.host
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if tc.site != "" {
				r.Header.Set("Sec-Fetch-Site", tc.site)
			}
			if err := o.check(r); (err == nil) != tc.ok {
				t.Errorf("check: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if _, err := newOriginCheck([]string{"airlock.example.com"}); err == nil {
		t.Error("an origin without scheme was accepted")
	}
}

func TestTokenEqual(t *testing.T) {
	if tokenEqual("", "") || tokenEqual("a", "") || tokenEqual("", "a") || tokenEqual("a", "b") || !tokenEqual("abc", "abc") {
		t.Error("tokenEqual")
	}
}

func TestSessionsTable(t *testing.T) {
	now := time.Now()
	s := newSessions(time.Minute, func() time.Time { return now })
	id, sess := s.create("", principal.Principal{})
	id2, sess2 := s.create("", principal.Principal{})
	if id == id2 || sess.csrf == sess2.csrf || sess.csrf == id {
		t.Fatal("ids or tokens repeat")
	}
	if got, st := s.lookup(id); got != sess || st != sessionValid {
		t.Fatalf("lookup: %v %v", got, st)
	}
	if _, st := s.lookup("forged"); st != sessionExpired {
		t.Errorf("unknown id: %v", st)
	}
	if _, st := s.lookup(""); st != sessionNone {
		t.Errorf("no id: %v", st)
	}
	for k := range s.m {
		if string(k[:]) == id {
			t.Error("the table holds the raw id")
		}
	}
	now = now.Add(time.Minute)
	if _, st := s.lookup(id); st != sessionExpired {
		t.Errorf("expired: %v", st)
	}
	s.remove(id2)
	if _, st := s.lookup(id2); st != sessionExpired {
		t.Errorf("removed: %v", st)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"": "/console/", "/console/audit": "/console/audit", "/console/sandboxes/x": "/console/sandboxes/x",
		"//evil.example/console/": "/console/", "https://evil.example/console/": "/console/", "/v1/sandboxes": "/console/",
		"/console/login": "/console/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAPIPassThrough: reads go to the API with the key, the API's error envelope comes
// back unchanged, and routes outside the allow-list (server proxy, watch) are refused.
func TestAPIPassThrough(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	tok := h.csrf(c)
	r, b := h.do(c, "POST", "/console/api/v1/sandboxes", `{}`, map[string]string{"Origin": h.srv.URL, CSRFHeader: tok,
		"OPEN-SANDBOX-API-KEY": "from-the-browser"})
	if r.StatusCode != 400 || !strings.Contains(string(b), `"code":"INVALID_REQUEST"`) || !strings.Contains(string(b), "image.uri is required") {
		t.Errorf("create error: %d %s", r.StatusCode, b)
	}
	// The revoke button's route passes through (a write: CSRF token and same origin).
	r, b = h.do(c, "POST", "/console/api/v1/sandboxes/sb1/signed-urls/revoke", "", map[string]string{"Origin": h.srv.URL, CSRFHeader: tok})
	if r.StatusCode != 200 || !strings.Contains(string(b), `"signedUrlEpoch":1`) {
		t.Errorf("revoke signed URLs: %d %s", r.StatusCode, b)
	}
	for _, p := range []string{"/console/api/v1/sandboxes/sb1/proxy/44772/ping", "/console/api/v1/internal/v1/watch", "/console/api/v1/metrics"} {
		if r, _ := h.do(c, "GET", p, "", nil); r.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, r.StatusCode)
		}
	}
	r, b = h.do(c, "GET", "/console/api/sandboxes", "", nil)
	var list struct {
		Items []sandboxRow `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil || r.StatusCode != 200 || len(list.Items) != 1 ||
		list.Items[0].PolicyName != "python-packages" || list.Items[0].PolicyVersion != 3 || !list.Items[0].HasPolicy {
		t.Errorf("sandboxes: %d %s", r.StatusCode, b)
	}
	h.api.mu.Lock()
	defer h.api.mu.Unlock()
	for _, k := range h.api.keys {
		if k != testKey {
			t.Errorf("the API got key %q", k)
		}
	}
}

func TestNoAuth(t *testing.T) {
	h := newHarness(t, "")
	c := h.client()
	r, b := h.do(c, "GET", "/console/login", "", nil)
	if r.StatusCode != 200 || !strings.Contains(string(b), "signing in is not needed") {
		t.Fatalf("login page: %d", r.StatusCode)
	}
	if resp := h.login(c, ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("no-auth login: %d", resp.StatusCode)
	}
	// Writes still need the token.
	if r, _ := h.do(c, "DELETE", "/console/api/v1/sandboxes/sb1", "", map[string]string{"Origin": h.srv.URL}); r.StatusCode != 403 {
		t.Errorf("no-auth write without token: %d", r.StatusCode)
	}
}

func TestExplain(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	for _, tc := range []struct {
		query, action, rule string
	}{
		{"target=pypi.org&port=443&proto=tcp", "allow", "egress[0]"},
		{"target=pypi.org&port=80&proto=tcp", "deny", "default"},
		{"target=denied.test", "deny", "default"},
		{"target=169.254.169.254", "deny", ""},
	} {
		r, b := h.do(c, "GET", "/console/api/sandboxes/sb1/explain?"+tc.query, "", nil)
		var x explainResponse
		if err := json.Unmarshal(b, &x); err != nil || r.StatusCode != 200 || x.Action != tc.action ||
			(tc.rule != "" && x.Rule != tc.rule) || x.PolicyVersion != 3 {
			t.Errorf("%s: %d %s", tc.query, r.StatusCode, b)
		}
	}
	if r, b := h.do(c, "GET", "/console/api/sandboxes/sb1/explain?target=x&port=70000", "", nil); r.StatusCode != 400 {
		t.Errorf("bad port: %d %s", r.StatusCode, b)
	}
	if r, b := h.do(c, "GET", "/console/api/sandboxes/nope/explain?target=x", "", nil); r.StatusCode != 404 ||
		!strings.Contains(string(b), "NOT_FOUND") {
		t.Errorf("unknown sandbox: %d %s", r.StatusCode, b)
	}
}

// TestAuditRoutes: search filters, export as JSON Lines, verification, statistics and
// the live stream (backlog, then a new record within the poll).
func TestAuditRoutes(t *testing.T) {
	h := newHarness(t, testKey)
	now := *h.now.Load()
	h.aw.Append(audit.Record{Time: now.Add(-2 * time.Minute), SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "pypi.org", Action: "allow"})
	h.aw.Append(audit.Record{Time: now.Add(-time.Minute), SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "evil.test", Action: "deny"})
	h.aw.Append(audit.Record{Time: now.Add(-time.Minute), SandboxID: "sb2", Source: audit.SourceBPF, DstIP: "198.51.100.7", DstPort: 22, Action: "deny"})
	waitWritten(t, h.aw, 3)
	c := h.client()
	h.login(c, testKey)

	r, b := h.do(c, "GET", "/console/api/audit?sandbox=sb1&action=deny", "", nil)
	var res struct {
		Records []audit.Record
		More    bool
	}
	if json.Unmarshal(b, &res); r.StatusCode != 200 || len(res.Records) != 1 || res.Records[0].DstHost != "evil.test" {
		t.Errorf("search: %d %s", r.StatusCode, b)
	}
	if r, b := h.do(c, "GET", "/console/api/audit?since=yesterday", "", nil); r.StatusCode != 400 || !strings.Contains(string(b), "RFC 3339") {
		t.Errorf("bad since: %d %s", r.StatusCode, b)
	}
	r, b = h.do(c, "GET", "/console/api/audit/export?since="+url.QueryEscape(now.Add(-90*time.Second).Format(time.RFC3339)), "", nil)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if r.StatusCode != 200 || !strings.Contains(r.Header.Get("Content-Disposition"), "attachment") || len(lines) != 2 {
		t.Errorf("export: %d %q %q", r.StatusCode, r.Header.Get("Content-Disposition"), b)
	}
	for _, l := range lines {
		var rec audit.Record
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Hash == "" {
			t.Errorf("export line %q: %v", l, err)
		}
	}
	r, b = h.do(c, "GET", "/console/api/audit/verify", "", nil)
	if r.StatusCode != 200 || !strings.Contains(string(b), `"ok":true`) || !strings.Contains(string(b), `"records":3`) {
		t.Errorf("verify: %d %s", r.StatusCode, b)
	}
	r, b = h.do(c, "GET", "/console/api/stats?minutes=5", "", nil)
	var st statsResponse
	if json.Unmarshal(b, &st); r.StatusCode != 200 || len(st.Series) != 2 || len(st.TopDenied) != 2 || st.Minutes != 5 {
		t.Fatalf("stats: %d %s", r.StatusCode, b)
	}
	var sb1 statsSeries
	for _, s := range st.Series {
		if s.SandboxID == "sb1" {
			sb1 = s
		}
	}
	if sum(sb1.Allowed) != 1 || sum(sb1.Denied) != 1 || sb1.Allowed[2] != 1 || sb1.Denied[3] != 1 {
		t.Errorf("sb1 series %+v (start %s)", sb1, st.Start)
	}
	if st.TopDenied[0].Destination != "198.51.100.7:22" && st.TopDenied[0].Destination != "evil.test" {
		t.Errorf("top denied %+v", st.TopDenied)
	}

	// The live stream: backlog (filtered), ready, then a new matching record.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+"/console/api/sandboxes/sb1/events?action=deny", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, ct)
	}
	events := readEvents(resp.Body)
	next := func() sseEvent {
		select {
		case ev := <-events:
			return ev
		case <-ctx.Done():
			t.Fatal("no event in time")
			return sseEvent{}
		}
	}
	if ev := next(); ev.name != "record" || !strings.Contains(ev.data, "evil.test") {
		t.Fatalf("backlog event %+v", ev)
	}
	if ev := next(); ev.name != "ready" {
		t.Fatalf("want ready, got %+v", ev)
	}
	t0 := time.Now()
	h.aw.Append(audit.Record{Time: time.Now(), SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "allowed.test", Action: "allow"})
	h.aw.Append(audit.Record{Time: time.Now(), SandboxID: "sb2", Source: audit.SourceDNS, DstHost: "other.test", Action: "deny"})
	h.aw.Append(audit.Record{Time: time.Now(), SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "denied.test", Action: "deny"})
	ev := next()
	if ev.name != "record" || !strings.Contains(ev.data, "denied.test") || ev.id == "" {
		t.Fatalf("live event %+v", ev)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("live record after %s", d)
	}
	if r, _ := h.do(c, "GET", "/console/api/sandboxes/nope/events", "", nil); r.StatusCode != 404 {
		t.Errorf("events of an unknown sandbox: %d", r.StatusCode)
	}
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

func waitWritten(t *testing.T, w *audit.Writer, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.Written() < n {
		if time.Now().After(deadline) {
			t.Fatalf("audit writer wrote %d of %d", w.Written(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type sseEvent struct{ id, name, data string }

func readEvents(r io.Reader) <-chan sseEvent {
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" || ev.data != "" {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.name = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			}
		}
	}()
	return ch
}
