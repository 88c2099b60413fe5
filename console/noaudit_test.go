package console

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/airlockdev/airlock/principal"
)

// TestAuditRoutesWithoutAuditDir: a console without an audit log (AuditDir empty, as
// `airlock lifecycle` on Kubernetes serves it) refuses a user key its audit routes
// first (403: the role is checked before the missing log), and answers a key that may
// read the audit 501.
func TestAuditRoutesWithoutAuditDir(t *testing.T) {
	keys, err := principal.NewKeyring(nil, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := keys.Create(principal.CreateRequest{Name: "bob", Role: principal.User})
	aud, _ := keys.Create(principal.CreateRequest{Name: "compliance", Role: principal.Auditor})
	con, err := New(Config{API: &fakeAPI{}, APIKey: testKey, Authenticate: keys.Authenticate, SessionTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	h := &harness{t: t, con: con, srv: srv}
	uc, ac := h.client(), h.client()
	h.login(uc, user.Key)
	h.login(ac, aud.Key)
	for _, p := range []string{"/console/api/audit", "/console/api/audit/verify", "/console/api/audit/export", "/console/api/stats"} {
		if resp, b := h.do(uc, "GET", p, "", nil); resp.StatusCode != 403 {
			t.Errorf("%s as a user without an audit log: %d %s, want 403", p, resp.StatusCode, b)
		}
		if resp, b := h.do(ac, "GET", p, "", nil); resp.StatusCode != 501 {
			t.Errorf("%s as an auditor without an audit log: %d %s, want 501", p, resp.StatusCode, b)
		}
	}
}
