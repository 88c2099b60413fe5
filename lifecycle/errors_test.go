package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

func TestFailEnvelope(t *testing.T) {
	for _, c := range []struct {
		name       string
		err        error
		status     int
		code, text string
	}{
		{"sentinel_with_detail", fmt.Errorf("%w: %q", ErrNotFound, "abc"), http.StatusNotFound, "SANDBOX_NOT_FOUND", `sandbox not found: "abc"`},
		{"access_denied", ErrAccessDenied, http.StatusUnauthorized, "UNAUTHORIZED", ErrAccessDenied.Text},
		{"internal_never_leaks", errors.New("bolt: database not open at /secret/path"), http.StatusInternalServerError, "INTERNAL_ERROR", "internal error; see the server log for this request id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logged strings.Builder
			log := slog.New(slog.NewTextHandler(&logged, nil))
			r := httptest.NewRequest(http.MethodGet, "/sandboxes/abc", nil)
			r.Header.Set(opensandbox.HeaderRequestID, "rid-1")
			rec := httptest.NewRecorder()
			fail(log, rec, r, c.err)
			var body opensandbox.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if rec.Code != c.status || body != (opensandbox.ErrorBody{Code: c.code, Message: c.text, RequestID: "rid-1"}) {
				t.Fatalf("got %d %+v, want %d %s %q", rec.Code, body, c.status, c.code, c.text)
			}
			if rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("headers %v", rec.Header())
			}
			internal := c.status == http.StatusInternalServerError
			if got := strings.Contains(logged.String(), "request_id=rid-1"); got != internal {
				t.Fatalf("logged %v, want %v: %s", got, internal, logged.String())
			}
		})
	}
}

func TestAccessRules(t *testing.T) {
	yes, no := true, false
	rules := accessRules{execdPort: opensandbox.ExecdPort, fallback: watch.Public}
	for _, c := range []struct {
		name   string
		secure bool
		port   int
		want   watch.AccessMode
	}{
		{"execd", false, opensandbox.ExecdPort, watch.Token},
		{"egress_api", false, opensandbox.EgressAPIPort, watch.Token},
		{"vnc", false, opensandbox.VNCPort, watch.Token},
		{"novnc", false, opensandbox.NoVNCPort, watch.Token},
		{"app_port", false, 8080, watch.Public},
		{"secure_app_port", true, 8080, watch.Token},
	} {
		if got := rules.portMode(c.secure, c.port); got != c.want {
			t.Errorf("%s: portMode = %s, want %s", c.name, got, c.want)
		}
	}
	w := rules.watchAccess(&record{AccessToken: "t", SecureAccess: &no})
	if w.Mode != watch.Public || w.ModeFor(opensandbox.ExecdPort) != watch.Token || w.ModeFor(opensandbox.EgressAPIPort) != watch.Token ||
		w.ModeFor(opensandbox.NoVNCPort) != watch.Token || w.ModeFor(opensandbox.VNCPort) != watch.Token ||
		w.TokenSHA256 != "e3b98a4da31a127d4bde6e43033f66ba274cab0eb7eb1c70ec41402bf6273dd8" {
		t.Errorf("watchAccess = %+v", w)
	}
	if w := rules.watchAccess(&record{AccessToken: "t", SecureAccess: &yes}); w.Mode != watch.Token {
		t.Errorf("secure sandbox: mode %s, want token", w.Mode)
	}
}
