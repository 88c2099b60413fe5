package lifecycle_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// memAudit keeps audit records in memory.
type memAudit struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (m *memAudit) Append(r audit.Record) {
	m.mu.Lock()
	m.recs = append(m.recs, r)
	m.mu.Unlock()
}

// ingress returns the records of source ingress.
func (m *memAudit) ingress() []audit.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []audit.Record
	for _, r := range m.recs {
		if r.Source == audit.SourceIngress {
			out = append(out, r)
		}
	}
	return out
}

// endpoint returns GET /v1/sandboxes/{id}/endpoints/{port}.
func (c *client) endpoint(id, port string) lifecycle.Endpoint {
	c.t.Helper()
	var ep lifecycle.Endpoint
	if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+id+"/endpoints/"+port, nil, http.StatusOK, ""), &ep); err != nil {
		c.t.Fatal(err)
	}
	return ep
}

// token returns the access token an endpoint hands out (64 hex digits), failing without;
// execd's endpoint also lists the execd token (43 characters), others nothing else.
func token(t *testing.T, ep lifecycle.Endpoint) string {
	t.Helper()
	tok := ep.Headers[lifecycle.AccessTokenHeader]
	want := 1
	if strings.HasSuffix(ep.Endpoint, "/44772") {
		if et := ep.Headers[lifecycle.ExecdTokenHeader]; len(et) != 43 {
			t.Fatalf("execd endpoint %+v: no %s header with a 43-character token", ep, lifecycle.ExecdTokenHeader)
		}
		want = 2
	}
	if len(tok) != 64 || len(ep.Headers) != want {
		t.Fatalf("endpoint %+v: want the %s header with a 64-digit token (and for execd %s only)", ep, lifecycle.AccessTokenHeader, lifecycle.ExecdTokenHeader)
	}
	return tok
}

// status sends method path with the headers (no API key unless among them) and returns
// the status, checking the JSON envelope of errors.
func (c *client) status(method, path string, hdr ...string) int {
	c.t.Helper()
	resp, b := c.do(method, path, nil, hdr...)
	if resp.StatusCode >= 300 {
		var e opensandbox.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.Code == "" || e.Message == "" {
			c.t.Fatalf("%s %s: %d with body %q", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

// TestServerProxyAccess: with an API key configured, the server proxy admits the API key
// or the sandbox's own access token (for that sandbox only, on any of its ports, never
// for the rest of the API); refusals are 401 and audited with source ingress, without the
// credential. Endpoints carry the token for execd, the egress API and secureAccess ports.
func TestServerProxyAccess(t *testing.T) {
	sink := &memAudit{}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: sink})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["entrypoint"] = []string{"python3", "-c", appServer}
	app := c.create(req)
	other := c.create(baseReq(h.Image, nil))
	secReq := baseReq(h.Image, nil)
	secReq["secureAccess"] = true
	sec := c.create(secReq)
	for _, id := range []string{app.ID, other.ID, sec.ID} {
		c.waitState(id, opensandbox.Running)
	}

	tok := token(t, c.endpoint(app.ID, "44772"))
	if egressTok := token(t, c.endpoint(app.ID, "18080")); egressTok != tok {
		t.Errorf("execd and egress API endpoints carry different tokens")
	}
	if ep := c.endpoint(app.ID, "8000"); len(ep.Headers) != 0 {
		t.Errorf("public port endpoint carries headers %v", ep.Headers)
	}
	if secTok := token(t, c.endpoint(sec.ID, "8000")); secTok == tok {
		t.Errorf("two sandboxes share a token")
	}
	otherTok := token(t, c.endpoint(other.ID, "44772"))

	anon := &client{t: t, base: h.HTTP.URL}
	ping := "/sandboxes/" + app.ID + "/proxy/44772/ping"
	policy := "/v1/sandboxes/" + app.ID + "/proxy/18080/policy"
	for _, path := range []string{ping, "/v1" + ping, policy} {
		for _, hdr := range [][]string{
			nil,
			{lifecycle.AccessTokenHeader, "wrong"},
			{lifecycle.AccessTokenHeader, otherTok}, // another sandbox's token
			{opensandbox.HeaderAPIKey, "wrong"},
		} {
			if st := anon.status("GET", path, hdr...); st != http.StatusUnauthorized {
				t.Errorf("GET %s with %v: %d, want 401", path, hdr, st)
			}
		}
		for _, hdr := range [][]string{
			{lifecycle.AccessTokenHeader, tok},
			{"X-Airlock-Access-Token", tok},
			{opensandbox.HeaderAPIKey, testKey},
			{opensandbox.HeaderAPIKey, testKey, lifecycle.AccessTokenHeader, "wrong"},
			{opensandbox.HeaderAPIKey, "stale", lifecycle.AccessTokenHeader, tok},
		} {
			if st := anon.status("GET", path, hdr...); st != http.StatusOK {
				t.Errorf("GET %s with a credential %v: %d, want 200", path, hdr[0], st)
			}
		}
	}
	// The token opens the sandbox's other ports through the server proxy (the API key
	// gate used to cover them all), and never the API itself.
	appPath := "/sandboxes/" + app.ID + "/proxy/8000/hello"
	for i := 0; anon.status("GET", appPath, lifecycle.AccessTokenHeader, tok) != http.StatusOK; i++ {
		if i == 300 {
			t.Fatal("the app never answered with the token")
		}
		time.Sleep(100 * time.Millisecond) // the app starts after execd
	}
	if st := anon.status("GET", appPath); st != http.StatusUnauthorized {
		t.Errorf("user port without a credential (API key configured): %d, want 401", st)
	}
	for _, path := range []string{"/v1/sandboxes/" + app.ID, "/v1/sandboxes", "/v1/sandboxes/" + app.ID + "/endpoints/44772"} {
		if st := anon.status("GET", path, lifecycle.AccessTokenHeader, tok); st != http.StatusUnauthorized {
			t.Errorf("GET %s with only the access token: %d, want 401", path, st)
		}
	}
	// An unknown sandbox is not revealed to a client without the API key.
	if st := anon.status("GET", "/sandboxes/nosuchsandbox0000/proxy/44772/ping"); st != http.StatusUnauthorized {
		t.Errorf("unknown sandbox without a credential: %d, want 401", st)
	}

	recs := sink.ingress()
	if len(recs) < 12 {
		t.Fatalf("%d ingress audit records, want at least 12", len(recs))
	}
	for _, r := range recs {
		b, _ := json.Marshal(r)
		if r.Action != "deny" || r.Extra["status"] != http.StatusUnauthorized || r.Extra["route"] != "server_proxy" ||
			r.SandboxID == "" || r.DstPort == 0 || strings.Contains(string(b), tok) || strings.Contains(string(b), otherTok) ||
			strings.Contains(string(b), testKey) {
			t.Fatalf("ingress record %s", b)
		}
	}
	for _, id := range []string{app.ID, other.ID, sec.ID} {
		c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
	}
}

// TestServerProxyNoAuth: without an API key (--no-auth) execd and the egress API behind
// the server proxy still need the sandbox's token; other ports follow DefaultAccess.
func TestServerProxyNoAuth(t *testing.T) {
	for name, mode := range map[string]watch.AccessMode{"default_unset": "", "default_token": watch.Token} {
		t.Run(name, func(t *testing.T) {
			h := lctest.New(t, lctest.Options{DefaultAccess: mode})
			c := &client{t: t, base: h.HTTP.URL}
			req := baseReq(h.Image, nil)
			req["entrypoint"] = []string{"python3", "-c", appServer}
			sb := c.create(req)
			c.waitState(sb.ID, opensandbox.Running)
			tok := token(t, c.endpoint(sb.ID, "44772"))
			base := "/sandboxes/" + sb.ID + "/proxy/"
			for _, path := range []string{base + "44772/ping", base + "18080/policy"} {
				if st := c.status("GET", path); st != http.StatusUnauthorized {
					t.Errorf("GET %s without the token: %d, want 401", path, st)
				}
				if st := c.status("GET", path, lifecycle.AccessTokenHeader, tok); st != http.StatusOK {
					t.Errorf("GET %s with the token: %d, want 200", path, st)
				}
			}
			app := base + "8000/hello"
			for i := 0; c.status("GET", app, lifecycle.AccessTokenHeader, tok) != http.StatusOK; i++ {
				if i == 300 {
					t.Fatal("the app never answered")
				}
				time.Sleep(100 * time.Millisecond) // the app starts after execd
			}
			want, headers, userMode := http.StatusOK, 0, watch.Public
			if mode == watch.Token {
				want, headers, userMode = http.StatusUnauthorized, 1, watch.Token
			}
			if st := c.status("GET", app); st != want {
				t.Errorf("user port without the token: %d, want %d", st, want)
			}
			if ep := c.endpoint(sb.ID, "8000"); len(ep.Headers) != headers {
				t.Errorf("user port endpoint headers %v, want %d", ep.Headers, headers)
			}
			if w, _ := h.Server.Hub().Get(sb.ID); w.Access.ModeFor(8000) != userMode ||
				w.Access.ModeFor(44772) != watch.Token || w.Access.ModeFor(18080) != watch.Token {
				t.Errorf("watch access %+v", w.Access)
			}
			c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
		})
	}
}

// TestAccessTokenAdoption: sandboxes stored before every sandbox had an access token
// get one when the server adopts them (persisted: the next start keeps it); a stored
// token still means secureAccess.
func TestAccessTokenAdoption(t *testing.T) {
	dir := t.TempDir()
	h1 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir, KeepContainers: true})
	c := newClient(t, h1)
	plain := c.create(baseReq(h1.Image, nil))
	secReq := baseReq(h1.Image, nil)
	secReq["secureAccess"] = true
	sec := c.create(secReq)
	c.waitState(plain.ID, opensandbox.Running)
	c.waitState(sec.ID, opensandbox.Running)
	secTok := token(t, c.endpoint(sec.ID, "8000"))
	h1.Stop()

	// Rewrite the records as an older Airlock stored them: no secureAccess flag, and a
	// token only for the secure-access sandbox.
	db, err := bolt.Open(filepath.Join(dir, "lifecycle.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("sandboxes"))
		for _, id := range []string{plain.ID, sec.ID} {
			var rec map[string]any
			if err := json.Unmarshal(b.Get([]byte(id)), &rec); err != nil {
				return err
			}
			delete(rec, "secureAccess")
			if id == plain.ID {
				delete(rec, "accessToken")
			}
			v, _ := json.Marshal(rec)
			if err := b.Put([]byte(id), v); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	h2 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir, KeepContainers: true})
	c2 := newClient(t, h2)
	c2.waitState(plain.ID, opensandbox.Running)
	tok := token(t, c2.endpoint(plain.ID, "44772"))
	if ep := c2.endpoint(plain.ID, "8000"); len(ep.Headers) != 0 {
		t.Errorf("adopted plain sandbox became secure-access: %v", ep.Headers)
	}
	if got := token(t, c2.endpoint(sec.ID, "8000")); got != secTok {
		t.Errorf("secure-access sandbox lost its token or mode")
	}
	sum := sha256.Sum256([]byte(tok))
	if w, _ := h2.Server.Hub().Get(plain.ID); w.Access.TokenSHA256 != hex.EncodeToString(sum[:]) || w.Access.ModeFor(44772) != watch.Token {
		t.Errorf("watch access of the adopted sandbox: %+v", w.Access)
	}
	anon := &client{t: t, base: h2.HTTP.URL}
	if st := anon.status("GET", "/sandboxes/"+plain.ID+"/proxy/44772/ping"); st != http.StatusUnauthorized {
		t.Errorf("adopted sandbox's execd without the token: %d", st)
	}
	if st := anon.status("GET", "/sandboxes/"+plain.ID+"/proxy/44772/ping", lifecycle.AccessTokenHeader, tok); st != http.StatusOK {
		t.Errorf("adopted sandbox's execd with its new token: %d", st)
	}
	h2.Stop()

	h3 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir})
	c3 := newClient(t, h3)
	if got := token(t, c3.endpoint(plain.ID, "44772")); got != tok {
		t.Errorf("the issued token was not persisted: changed on the next start")
	}
	for _, id := range []string{plain.ID, sec.ID} {
		c3.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
	}
}
