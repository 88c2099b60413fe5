package execd

import (
	"github.com/airlockdev/airlock/opensandbox"

	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
)

// TestHoldDelaysRequestsUntilRelease: a held server answers GET /ping at once, makes a
// command wait until POST ReleasePath, then runs it; the release and GET ReleasePath
// (held or not) need the token.
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
			req.Header.Set(opensandbox.HeaderExecdAccessToken, token)
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
	if code, b := do("GET", opensandbox.ReleasePath, "", "tok"); code != http.StatusOK || !strings.Contains(b, `"held":true`) {
		t.Fatalf("release state while held: %d %s", code, b)
	}
	if code, _ := do("GET", opensandbox.ReleasePath, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("anonymous release state: %d, want 401", code)
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
	if code, _ := do("POST", opensandbox.ReleasePath, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("anonymous release: %d, want 401", code)
	}
	if !hold.Held() {
		t.Fatal("an anonymous client released the hold")
	}
	if code, _ := do("POST", opensandbox.ReleasePath, "", "tok"); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	if code, b := do("GET", opensandbox.ReleasePath, "", "tok"); code != http.StatusOK || !strings.Contains(b, `"held":false`) {
		t.Fatalf("release state after release: %d %s", code, b)
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

// TestReleaseWithEnv: a release carrying env sets it for everything started afterwards
// and hands over the entrypoint; a second release with a body is refused (409) and
// changes nothing; a malformed body is 400 and does not release.
func TestReleaseWithEnv(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		testenv.SkipOrFail(t, "no bash on this host")
	}
	hold := &Hold{}
	s, err := New(Config{Workdir: t.TempDir(), StateDir: t.TempDir(), Hold: hold})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := post(opensandbox.ReleasePath, `{"env":{"AIRLOCK_T_CLAIM":`); code != http.StatusBadRequest || !hold.Held() {
		t.Fatalf("malformed release: %d %s, held %v", code, b, hold.Held())
	}
	if code, b := post(opensandbox.ReleasePath, `{"env":{"BAD=NAME":"x"}}`); code != http.StatusBadRequest || !hold.Held() {
		t.Fatalf("bad env name: %d %s, held %v", code, b, hold.Held())
	}
	t.Cleanup(func() { os.Unsetenv("AIRLOCK_T_CLAIM") })
	if code, b := post(opensandbox.ReleasePath, `{"env":{"AIRLOCK_T_CLAIM":"claimed-value"},"entrypoint":["sleep","1"]}`); code != http.StatusNoContent {
		t.Fatalf("release with env: %d %s", code, b)
	}
	if got := hold.Entrypoint(); strings.Join(got, " ") != "sleep 1" {
		t.Fatalf("entrypoint handed over: %q", got)
	}
	if code, b := post(opensandbox.ReleasePath, `{"env":{"AIRLOCK_T_CLAIM":"second"}}`); code != http.StatusConflict {
		t.Fatalf("second release with a body: %d %s, want 409", code, b)
	}
	if code, _ := post(opensandbox.ReleasePath, ""); code != http.StatusNoContent {
		t.Fatalf("plain release after release: %d, want 204 (idempotent)", code)
	}
	_, b := post("/command", `{"command":"echo v=$AIRLOCK_T_CLAIM"}`)
	if !strings.Contains(b, `v=claimed-value`) {
		t.Fatalf("command after release does not see the released env: %s", b)
	}
}
