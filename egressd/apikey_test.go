package egressd

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockdev/airlock/opensandbox"
)

// TestRequireAPIKey: the node APIs answer only the API key: none, a wrong one, or any
// key when none is configured gets 401; the key passes.
func TestRequireAPIKey(t *testing.T) {
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }
	for _, c := range []struct {
		configured, sent string
		want             int
	}{
		{"k-1", "", http.StatusUnauthorized},
		{"k-1", "k-2", http.StatusUnauthorized},
		{"", "", http.StatusUnauthorized},
		{"", "anything", http.StatusUnauthorized},
		{"k-1", "k-1", http.StatusNoContent},
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/snapshot/remove", nil)
		if c.sent != "" {
			req.Header.Set(opensandbox.HeaderAPIKey, c.sent)
		}
		rec := httptest.NewRecorder()
		requireAPIKey(c.configured, ok)(rec, req)
		if rec.Code != c.want {
			t.Errorf("configured %q, sent %q: %d, want %d", c.configured, c.sent, rec.Code, c.want)
		}
	}
}
