package console

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/principal"
)

// TestRolesInConsole: any key signs in; the page names the principal and its role and
// shows only the pages the role may use; the session calls the API with its own key
// (so the API decides what it may do); the console's own audit routes refuse a user;
// revoking the key ends its session at the next request.
func TestRolesInConsole(t *testing.T) {
	keys, err := principal.NewKeyring(nil, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := keys.Create(principal.CreateRequest{Name: "agent bot", Role: principal.User})
	aud, _ := keys.Create(principal.CreateRequest{Name: "compliance", Role: principal.Auditor})

	api := &fakeAPI{} // accepts any key, records the ones it gets
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	con, err := New(Config{API: api, APIKey: testKey, Authenticate: keys.Authenticate, AuditDir: dir, SessionTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	h := &harness{t: t, api: api, con: con, srv: srv, dir: dir}

	uc := h.client()
	if resp := h.login(uc, "ak_nobody"); resp.StatusCode != 401 {
		t.Fatalf("sign-in with an unknown key: %d", resp.StatusCode)
	}
	if resp := h.login(uc, user.Key); resp.StatusCode != 303 {
		t.Fatalf("sign-in with a user key: %d", resp.StatusCode)
	}
	resp, page := h.do(uc, "GET", "/console/", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(page), "agent bot · user") ||
		strings.Contains(string(page), `href="/console/audit"`) || strings.Contains(string(page), `href="/console/keys"`) ||
		strings.Contains(string(page), user.Key) {
		t.Fatalf("the user's page (%d) must name the principal and role and hide audit and keys:\n%s", resp.StatusCode, page)
	}
	if resp, b := h.do(uc, "GET", "/console/api/session", "", nil); resp.StatusCode != 200 || !strings.Contains(string(b), `"role":"user"`) {
		t.Fatalf("session: %d %s", resp.StatusCode, b)
	}
	if resp, b := h.do(uc, "GET", "/console/api/audit", "", nil); resp.StatusCode != 403 || !strings.Contains(string(b), "FORBIDDEN") {
		t.Fatalf("audit search as a user: %d %s, want 403", resp.StatusCode, b)
	}
	api.mu.Lock()
	api.keys = nil
	api.mu.Unlock()
	if resp, b := h.do(uc, "GET", "/console/api/v1/sandboxes", "", nil); resp.StatusCode != 200 {
		t.Fatalf("sandboxes as a user: %d %s", resp.StatusCode, b)
	}
	api.mu.Lock()
	got := append([]string(nil), api.keys...)
	api.mu.Unlock()
	if len(got) != 1 || got[0] != user.Key {
		t.Fatalf("the API got keys %q, want the user's own key", got)
	}

	ac := h.client()
	h.login(ac, aud.Key)
	if resp, b := h.do(ac, "GET", "/console/api/audit", "", nil); resp.StatusCode != 200 {
		t.Fatalf("audit search as an auditor: %d %s", resp.StatusCode, b)
	}
	if _, page := h.do(ac, "GET", "/console/", "", nil); !strings.Contains(string(page), `href="/console/audit"`) || strings.Contains(string(page), `href="/console/keys"`) {
		t.Fatalf("the auditor's page must show the audit log and not the keys:\n%s", page)
	}
	adm := h.client()
	h.login(adm, testKey)
	if _, page := h.do(adm, "GET", "/console/keys", "", nil); !strings.Contains(string(page), `href="/console/keys"`) || !strings.Contains(string(page), "keys.js") {
		t.Fatalf("the admin's keys page:\n%s", page)
	}

	if err := keys.Revoke(user.ID); err != nil {
		t.Fatal(err)
	}
	if resp, b := h.do(uc, "GET", "/console/api/v1/sandboxes", "", nil); resp.StatusCode != 401 || !strings.Contains(string(b), "SESSION_EXPIRED") {
		t.Fatalf("after revocation: %d %s, want 401 SESSION_EXPIRED", resp.StatusCode, b)
	}
}
