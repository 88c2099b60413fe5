package execd

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockdev/airlock/opensandbox"
)

// TestAccessTokenSHA256: a server given only the token's SHA-256 admits the token and
// refuses a wrong, an empty or a missing one (and the digest itself), /ping stays
// open; a digest of the wrong length is an error of New.
func TestAccessTokenSHA256(t *testing.T) {
	sum := sha256.Sum256([]byte("tok-secret"))
	if _, err := New(Config{Workdir: t.TempDir(), StateDir: t.TempDir(), AccessTokenSHA256: sum[:5]}); err == nil {
		t.Fatal("New admitted a 5-byte digest")
	}
	s, err := New(Config{Workdir: t.TempDir(), StateDir: t.TempDir(), AccessTokenSHA256: sum[:]})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	code := func(path, token string, set bool) int {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		if set {
			req.Header.Set(opensandbox.HeaderExecdAccessToken, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := code("/ping", "", false); c != http.StatusOK {
		t.Errorf("ping without a token: %d", c)
	}
	if c := code("/metrics", "tok-secret", true); c == http.StatusUnauthorized {
		t.Errorf("the right token: %d", c)
	}
	for _, bad := range []struct {
		token string
		set   bool
	}{{"", false}, {"", true}, {"tok-wrong", true}, {hex.EncodeToString(sum[:]), true}} {
		if c := code("/metrics", bad.token, bad.set); c != http.StatusUnauthorized {
			t.Errorf("token %q (set %v): %d, want 401", bad.token, bad.set, c)
		}
	}
}
