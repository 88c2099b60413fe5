package lifecycle_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/console"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/principal"
)

// TestControlRecordsFromConsole: the console's writes pass through lifecycle's
// handler with the session's key, so they are control-plane records naming the
// signed-in principal, like the API's: a key made and revoked from the console, and a
// user's refused key create (403).
func TestControlRecordsFromConsole(t *testing.T) {
	sink := &memAudit{}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: sink})
	con, err := console.New(console.Config{API: h.Server.Handler(), APIKey: testKey, Authenticate: h.Server.Keys().Authenticate,
		SessionTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	do := func(c *http.Client, method, path, body, csrf string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Origin", srv.URL)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if csrf != "" {
			req.Header.Set(console.CSRFHeader, csrf)
			req.Header.Set("Content-Type", "application/json")
		} else if method == "POST" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	signIn := func(key string) (*http.Client, string) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		if code, b := do(c, "POST", "/console/login", url.Values{"key": {key}}.Encode(), ""); code != 303 {
			t.Fatalf("sign-in: %d %s", code, b)
		}
		_, page := do(c, "GET", "/console/", "", "")
		_, rest, _ := strings.Cut(page, `name="csrf-token" content="`)
		tok, _, _ := strings.Cut(rest, `"`)
		return c, tok
	}
	admin, tok := signIn(testKey)
	code, b := do(admin, "POST", "/console/api/v1/keys", `{"name":"from console","role":"user"}`, tok)
	if code != 201 {
		t.Fatalf("key create through the console: %d %s", code, b)
	}
	_, rest, _ := strings.Cut(b, `"id":"`)
	id, _, _ := strings.Cut(rest, `"`)
	_, rest, _ = strings.Cut(b, `"key":"`)
	key, _, _ := strings.Cut(rest, `"`)
	user, utok := signIn(key)
	if code, b := do(user, "POST", "/console/api/v1/keys", `{"name":"x","role":"admin"}`, utok); code != 403 {
		t.Fatalf("key create by a user through the console: %d %s", code, b)
	}
	if code, b := do(admin, "DELETE", "/console/api/v1/keys/"+id, "", tok); code != 204 {
		t.Fatalf("key revoke through the console: %d %s", code, b)
	}

	var got []string
	sink.mu.Lock()
	for _, r := range sink.recs {
		if r.Source == audit.SourceControl {
			got = append(got, r.Action+" "+str(r.Extra["op"])+" "+str(r.Extra["principal"])+" "+str(r.Extra["target"]))
		}
	}
	sink.mu.Unlock()
	want := []string{
		"allow key.create " + principal.ConfiguredAdminID + " " + id,
		"deny key.create " + id + " ",
		"allow key.revoke " + principal.ConfiguredAdminID + " " + id,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("control records of the console's writes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, r := range sink.recs {
		if strings.Contains(r.Reason+str(r.Extra["path"]), key) {
			t.Errorf("a record holds the key: %+v", r)
		}
	}
}
