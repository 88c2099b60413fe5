package console

import (
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// loginFrom posts the sign-in form to the handler as if from remote ("ip:port") and
// returns the status. body, when set, replaces the form body.
func (h *harness) loginFrom(remote, key string, body io.Reader) int {
	if body == nil {
		body = strings.NewReader(url.Values{"key": {key}}.Encode())
	}
	req := httptest.NewRequest("POST", "http://console.test/console/login", body)
	req.RemoteAddr = remote
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://console.test")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	rec := httptest.NewRecorder()
	h.con.ServeHTTP(rec, req)
	return rec.Code
}

// TestLoginLimitPerClient: one client exhausting its failures gets 429 while another
// client, even one trying at the same time, still signs in; the limit lifts a minute later.
func TestLoginLimitPerClient(t *testing.T) {
	h := newHarness(t, testKey)
	const attacker, operator = "198.51.100.7:40000", "203.0.113.9:50000"
	for i := range loginPerClient {
		if code := h.loginFrom(attacker, "wrong", nil); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i, code)
		}
	}
	if code := h.loginFrom(attacker, testKey, nil); code != http.StatusTooManyRequests {
		t.Fatalf("attacker after %d failures: %d, want 429", loginPerClient, code)
	}
	// another port of the same address is the same client
	if code := h.loginFrom("198.51.100.7:40001", testKey, nil); code != http.StatusTooManyRequests {
		t.Errorf("attacker from another port: %d, want 429", code)
	}
	if code := h.loginFrom(operator, testKey, nil); code != http.StatusSeeOther {
		t.Fatalf("operator locked out by another client: %d, want 303", code)
	}
	// IPv6 clients are counted per /64: another address in the same /64 is the same client
	for range loginPerClient {
		h.loginFrom("[2001:db8:1:2::1]:443", "wrong", nil)
	}
	if code := h.loginFrom("[2001:db8:1:2::ffff]:443", testKey, nil); code != http.StatusTooManyRequests {
		t.Errorf("same /64: %d, want 429", code)
	}
	if code := h.loginFrom("[2001:db8:1:3::1]:443", testKey, nil); code != http.StatusSeeOther {
		t.Errorf("another /64: %d, want 303", code)
	}
	h.advance(time.Minute)
	if code := h.loginFrom(attacker, testKey, nil); code != http.StatusSeeOther {
		t.Errorf("attacker a minute later with the key: %d, want 303", code)
	}
}

// TestLoginSuccessDoesNotCount: sign-ins that succeed take no failure slot.
func TestLoginSuccessDoesNotCount(t *testing.T) {
	h := newHarness(t, testKey)
	const client = "198.51.100.8:1"
	for range 2 * loginPerClient {
		if code := h.loginFrom(client, testKey, nil); code != http.StatusSeeOther {
			t.Fatalf("sign-in: %d", code)
		}
	}
	for range loginPerClient {
		if code := h.loginFrom(client, "wrong", nil); code != http.StatusUnauthorized {
			t.Fatalf("failure: %d, want 401", code)
		}
	}
}

// gate is a request body that holds every reader until n readers wait or max passes,
// so that concurrent sign-ins are all between the limit check and the key check at
// once.
type gate struct {
	n, max  int
	mu      sync.Mutex
	waiting int
	open    chan struct{}
}

func newGate(n int, max time.Duration) *gate {
	g := &gate{n: n, open: make(chan struct{})}
	time.AfterFunc(max, g.release)
	return g
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) body(form string) io.Reader {
	r := strings.NewReader(form)
	first := true
	return readerFunc(func(p []byte) (int, error) {
		if first {
			first = false
			g.mu.Lock()
			g.waiting++
			full := g.waiting == g.n
			g.mu.Unlock()
			if full {
				g.release()
			}
			<-g.open
		}
		return r.Read(p)
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestLoginLimitConcurrent: 50 wrong sign-ins from one client at once get at most
// loginPerClient answers of 401; the others are 429.
func TestLoginLimitConcurrent(t *testing.T) {
	h := newHarness(t, testKey)
	const n = 50
	g := newGate(n, 500*time.Millisecond)
	var wrong, limited, other atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch h.loginFrom("198.51.100.9:"+strconv.Itoa(1000+i), "", g.body("key=wrong")) {
			case http.StatusUnauthorized:
				wrong.Add(1)
			case http.StatusTooManyRequests:
				limited.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	if wrong.Load() > loginPerClient || other.Load() != 0 || wrong.Load()+limited.Load() != n {
		t.Fatalf("%d concurrent wrong sign-ins: %d checked (limit %d), %d refused, %d other",
			n, wrong.Load(), loginPerClient, limited.Load(), other.Load())
	}
	if code := h.loginFrom("198.51.100.9:9", testKey, nil); code != http.StatusTooManyRequests {
		t.Errorf("after the burst: %d, want 429", code)
	}
}

// TestLoginGlobalCeiling: failures spread over many clients, each under its own limit,
// stop at loginCeiling for the whole console until the minute passes.
func TestLoginGlobalCeiling(t *testing.T) {
	h := newHarness(t, testKey)
	failed := 0
	for i := 0; failed < loginCeiling; i++ {
		remote := "10.0." + strconv.Itoa(i/200) + "." + strconv.Itoa(i%200+1) + ":1"
		for range loginPerClient - 1 {
			if failed == loginCeiling {
				break
			}
			if code := h.loginFrom(remote, "wrong", nil); code != http.StatusUnauthorized {
				t.Fatalf("failure %d from %s: %d, want 401", failed, remote, code)
			}
			failed++
		}
	}
	if code := h.loginFrom("192.0.2.200:1", "wrong", nil); code != http.StatusTooManyRequests {
		t.Fatalf("a fresh client past the ceiling: %d, want 429", code)
	}
	h.advance(time.Minute)
	if code := h.loginFrom("192.0.2.200:1", testKey, nil); code != http.StatusSeeOther {
		t.Errorf("a minute later: %d, want 303", code)
	}
}

// TestSignInsAudited: a failed sign-in, a sign-in and a sign-out are control records in
// the audit chain (op, outcome, the principal once known, the client), and neither
// the key tried, the key used nor the session id is anywhere in the audit directory.
func TestSignInsAudited(t *testing.T) {
	h := newHarness(t, testKey)
	h.con.cfg.Audit = h.aw // as stack wires it
	c := h.client()
	const wrong = "wrong-key-0123456789"
	if r := h.login(c, wrong); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d", r.StatusCode)
	}
	r := h.login(c, testKey)
	if r.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", r.StatusCode)
	}
	var sid string
	for _, ck := range r.Cookies() {
		if ck.Name == CookieName {
			sid = ck.Value
		}
	}
	tok := h.csrf(c)
	if r, _ := h.do(c, "POST", "/console/logout", "", map[string]string{CSRFHeader: tok, "Origin": h.srv.URL}); r.StatusCode != http.StatusNoContent {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); len(got) < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		recs, _, err := audit.Query(h.dir, audit.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, rec := range recs {
			if rec.Source == audit.SourceControl {
				got = append(got, fmt.Sprint(rec.Extra["op"], " ", rec.Action, " ", rec.Extra["status"], " ", rec.Extra["principal"], " ", rec.Src != ""))
			}
		}
	}
	want := []string{
		"console.sign_in deny 401 <nil> true",
		"console.sign_in allow 303 admin true",
		"console.sign_out allow 204 admin true",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("sign-in records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, secret := range []string{wrong, testKey, sid} {
		if secret == "" {
			t.Fatal("no session cookie")
		}
		if hit := grepDir(t, h.dir, secret); hit != "" {
			t.Errorf("a secret is in the audit directory (%s)", hit)
		}
	}
}

// grepDir returns the first file under dir that contains s, "" when none does.
func grepDir(t *testing.T, dir, s string) string {
	t.Helper()
	var hit string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || hit != "" {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), s) {
			hit = p
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return hit
}
