package execd

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
)

// TestHoldDelaysRequestsUntilRelease: a held server answers GET /ping at once, makes a
// command wait until POST ReleasePath, then runs it; the release needs the token.
func TestHoldDelaysRequestsUntilRelease(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		testenv.SkipOrFail(t, "no bash on this host")
	}
	hold := &Hold{}
	s, err := New(Config{Workdir: t.TempDir(), StateDir: t.TempDir(), Hold: hold, AccessToken: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	do := func(method, path, body, token string) (int, string) {
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set(TokenHeader, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := do("GET", "/ping", "", "tok"); code != http.StatusOK {
		t.Fatalf("ping while held: %d", code)
	}
	done := make(chan string, 1)
	go func() {
		_, b := do("POST", "/command", `{"command":"echo after-release"}`, "tok")
		done <- b
	}()
	select {
	case b := <-done:
		t.Fatalf("command answered while held: %s", b)
	case <-time.After(300 * time.Millisecond):
	}
	if code, _ := do("POST", ReleasePath, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("anonymous release: %d, want 401", code)
	}
	if !hold.Held() {
		t.Fatal("an anonymous client released the hold")
	}
	if code, _ := do("POST", ReleasePath, "", "tok"); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	select {
	case b := <-done:
		if !strings.Contains(b, `"text":"after-release"`) {
			t.Fatalf("command after release: %s", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("command still held after release")
	}
}
