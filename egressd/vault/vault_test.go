package vault

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const (
	sbx    = "sbx1"
	secret = "sk-test-SECRET-value-123"
	other  = "key-OTHER-secret-456"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.CA(sbx); err != nil {
		t.Fatal(err)
	}
	return s
}

// call sends method rest body through ServeAPI; cover allows everything but
// denied.example.
func call(t *testing.T, s *Store, method, rest, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "http://sandbox:18080"+rest, strings.NewReader(body))
	s.ServeAPI(rec, req, sbx, rest, func(host string, port uint16) error {
		if strings.HasSuffix(host, "denied.example") {
			return fmt.Errorf("%s port %d is not allowed", host, port)
		}
		return nil
	})
	return rec.Code, rec.Body.String()
}

const createBody = `{"credentials":[{"name":"gh","source":{"type":"inline","value":"` + secret + `"}}],
 "bindings":[{"name":"gh-api","match":{"hosts":["api.github.com"],"methods":["get"],"paths":["/repos/*"]},"auth":{"type":"bearer","credential":"gh"}}]}`

func TestAPILifecycle(t *testing.T) {
	s := open(t, t.TempDir())
	if code, _ := call(t, s, "GET", "/credential-vault", ""); code != 404 {
		t.Errorf("GET before create: %d, want 404", code)
	}
	code, body := call(t, s, "POST", "/credential-vault", createBody)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var st State
	must(t, json.Unmarshal([]byte(body), &st))
	if st.Revision != 1 || len(st.Credentials) != 1 || st.Credentials[0].SourceType != "inline" || st.Bindings[0].Auth.Type != "bearer" {
		t.Errorf("created state: %s", body)
	}
	b := st.Bindings[0].Match
	if b.Methods[0] != "GET" || b.Schemes[0] != "https" || b.Ports[0] != 443 {
		t.Errorf("defaults not filled or not normalized: %+v", b)
	}
	if code, _ := call(t, s, "POST", "/credential-vault", createBody); code != 409 {
		t.Errorf("second create: %d, want 409", code)
	}
	for rest, want := range map[string]int{
		"/credential-vault/credentials": 200, "/credential-vault/credentials/gh": 200, "/credential-vault/credentials/x": 404,
		"/credential-vault/bindings": 200, "/credential-vault/bindings/gh-api": 200, "/credential-vault/bindings/x": 404,
	} {
		if code, body := call(t, s, "GET", rest, ""); code != want {
			t.Errorf("GET %s: %d %s, want %d", rest, code, body, want)
		}
	}

	patch := `{"expectedRevision":1,"credentials":{"add":[{"name":"svc","source":{"type":"inline","value":"` + other + `"}}]},
	 "bindings":{"add":[{"name":"svc-key","match":{"hosts":["*.svc.example"],"schemes":["http","https"],"ports":[80,443]},"auth":{"type":"apiKey","name":"X-Api-Key","credential":"svc"}}]}}`
	code, body = call(t, s, "PATCH", "/credential-vault", patch)
	if code != 200 || !strings.Contains(body, `"revision":2`) {
		t.Fatalf("patch: %d %s", code, body)
	}
	if code, _ := call(t, s, "PATCH", "/credential-vault", `{"expectedRevision":1,"bindings":{"delete":["gh-api"]}}`); code != 409 {
		t.Errorf("stale revision: %d, want 409", code)
	}
	if code, _ := call(t, s, "DELETE", "/credential-vault", ""); code != 204 {
		t.Errorf("delete: %d", code)
	}
	if code, _ := call(t, s, "GET", "/credential-vault", ""); code != 404 {
		t.Errorf("GET after delete: %d, want 404", code)
	}
	if _, ok := s.Match(sbx, Request{Scheme: "https", Host: "api.github.com", Port: 443, Method: "GET", Path: "/repos/x"}); ok {
		t.Error("a deleted vault still injects")
	}
}

// TestMutationIsAtomic: a PATCH with one bad part changes nothing.
func TestMutationIsAtomic(t *testing.T) {
	s := open(t, t.TempDir())
	call(t, s, "POST", "/credential-vault", createBody)
	for name, body := range map[string]string{
		"dangling_reference": `{"credentials":{"delete":["gh"]}}`,
		"replace_missing":    `{"bindings":{"replace":[{"name":"nope","match":{"hosts":["a.example"]},"auth":{"type":"bearer","credential":"gh"}}]}}`,
		"add_existing":       `{"bindings":{"add":[{"name":"gh-api","match":{"hosts":["a.example"]},"auth":{"type":"bearer","credential":"gh"}}]}}`,
		"not_covered":        `{"bindings":{"add":[{"name":"x","match":{"hosts":["denied.example"]},"auth":{"type":"bearer","credential":"gh"}}]}}`,
		"bad_host_after_ok":  `{"credentials":{"add":[{"name":"ok","source":{"type":"inline","value":"v"}}]},"bindings":{"add":[{"name":"x","match":{"hosts":["not a host"]},"auth":{"type":"bearer","credential":"ok"}}]}}`,
		"unknown_field":      `{"bindings":{"add":[]},"extra":1}`,
		"bad_auth_type":      `{"bindings":{"add":[{"name":"x","match":{"hosts":["a.example"]},"auth":{"type":"digest","credential":"gh"}}]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			code, body := call(t, s, "PATCH", "/credential-vault", body)
			if code < 400 {
				t.Fatalf("accepted: %d %s", code, body)
			}
			_, st := call(t, s, "GET", "/credential-vault", "")
			if !strings.Contains(st, `"revision":1`) || strings.Count(st, `"name"`) != 2 {
				t.Errorf("state changed by a rejected PATCH: %s", st)
			}
		})
	}
	if code, _ := call(t, s, "PATCH", "/credential-vault", `{"bindings":{"add":[{"name":"x","match":{"hosts":["denied.example"]},"auth":{"type":"bearer","credential":"gh"}}]}}`); code != 412 {
		t.Errorf("uncovered binding: %d, want 412", code)
	}
}

func TestMatchAndInjection(t *testing.T) {
	s := open(t, t.TempDir())
	body := `{"credentials":[{"name":"a","source":{"type":"inline","value":"AAA"}},{"name":"b","source":{"type":"inline","value":"QkJC"}}],
	 "bindings":[
	  {"name":"exact","match":{"hosts":["api.example"],"paths":["/v1/exact"]},"auth":{"type":"bearer","credential":"a"}},
	  {"name":"basic","match":{"hosts":["api.example"],"paths":["/v1/*"],"methods":["POST"]},"auth":{"type":"basic","credential":"b"}},
	  {"name":"wild","match":{"hosts":["*.cdn.example"],"schemes":["http"],"ports":[8080]},"auth":{"type":"customHeaders","headers":[{"name":"X-A","credential":"a"},{"name":"X-B","credential":"b"}]}}]}`
	if code, b := call(t, s, "POST", "/credential-vault", body); code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	tests := []struct {
		name    string
		q       Request
		binding string
		headers []Header
	}{
		{"exact_path", Request{"https", "api.example", 443, "GET", "/v1/exact"}, "exact", []Header{{"Authorization", "Bearer AAA"}}},
		{"exact_path_is_exact", Request{"https", "api.example", 443, "GET", "/v1/exact/more"}, "", nil},
		{"prefix_and_method", Request{"https", "api.example", 443, "POST", "/v1/things"}, "basic", []Header{{"Authorization", "Basic QkJC"}}},
		{"method_case_is_exact", Request{"https", "api.example", 443, "post", "/v1/things"}, "", nil},
		{"method_not_bound", Request{"https", "api.example", 443, "PUT", "/v1/things"}, "", nil},
		{"wrong_port", Request{"https", "api.example", 8443, "GET", "/v1/exact"}, "", nil},
		{"wrong_scheme", Request{"http", "api.example", 443, "GET", "/v1/exact"}, "", nil},
		{"wildcard_subdomain", Request{"http", "img.cdn.example", 8080, "GET", "/x"}, "wild", []Header{{"X-A", "AAA"}, {"X-B", "QkJC"}}},
		{"wildcard_not_apex", Request{"http", "cdn.example", 8080, "GET", "/x"}, "", nil},
		{"other_host", Request{"https", "evil.example", 443, "GET", "/v1/exact"}, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inj, ok := s.Match(sbx, tc.q)
			if ok != (tc.binding != "") || inj.Binding != tc.binding || fmt.Sprint(inj.Headers) != fmt.Sprint(tc.headers) {
				t.Errorf("Match = %v %+v, want binding %q headers %v", ok, inj, tc.binding, tc.headers)
			}
		})
	}
	if !s.Intercepts(sbx, "https", "api.example", 443) || s.Intercepts(sbx, "https", "api.example", 80) ||
		!s.Intercepts(sbx, "http", "a.cdn.example", 8080) || s.Intercepts("other-sandbox", "https", "api.example", 443) {
		t.Error("Intercepts disagrees with the bindings")
	}
}

// TestSealedRestartTamper: nothing secret is on disk in clear, a reopened store serves
// the same vault and CA, and a flipped byte fails Open naming the file.
func TestSealedRestartTamper(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	call(t, s, "POST", "/credential-vault", createBody)
	cert, key, _, _ := s.CA(sbx)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, keyDER) || bytes.Contains(b, []byte("gh-api")) {
			t.Errorf("%s holds a secret, the CA key or a name in clear", f)
		}
		if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	s2, err := Open(dir, nil)
	must(t, err)
	if inj, ok := s2.Match(sbx, Request{"https", "api.github.com", 443, "GET", "/repos/a"}); !ok || inj.Headers[0].Value != "Bearer "+secret {
		t.Errorf("reopened store: %v %+v", ok, inj)
	}
	if c2, _, _, _ := s2.CA(sbx); !c2.Equal(cert) {
		t.Error("reopened store has another CA")
	}
	f := filepath.Join(dir, sbx+".vault")
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 1
	must(t, os.WriteFile(f, b, 0o600))
	if _, err := Open(dir, nil); err == nil || !strings.Contains(err.Error(), f) {
		t.Errorf("tampered file: Open err %v, want one naming %s", err, f)
	}
	must(t, s2.Delete(sbx))
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Delete left %s", f)
	}
	must(t, s2.Delete(sbx)) // idempotent
}

// TestSecretsNeverEchoed sends values where errors are reported: no response, no
// change record carries them.
func TestSecretsNeverEchoed(t *testing.T) {
	s := open(t, t.TempDir())
	var changes []Change
	s.OnChange(func(c Change) { changes = append(changes, c) })
	bodies := []string{
		`{"credentials":[{"name":"c","source":{"type":"file","value":"` + secret + `"}}],"bindings":[]}`,
		`{"credentials":[{"name":"c","source":{"type":"inline","value":` + secret + `}}],"bindings":[]}`,
		`{"credentials":[{"name":"c","source":{"type":"inline","value":"` + secret + `","x":1}}],"bindings":[]}`,
		`{"credentials":[{"name":"c","source":{"type":"inline","value":["` + secret + `"]}}],"bindings":[]}`,
		createBody,
	}
	for _, b := range bodies {
		_, resp := call(t, s, "POST", "/credential-vault", b)
		if strings.Contains(resp, secret) {
			t.Errorf("response echoes the secret: %s", resp)
		}
	}
	if len(changes) != 1 || fmt.Sprint(changes[0]) == "" || strings.Contains(fmt.Sprint(changes), secret) {
		t.Errorf("changes: %+v", changes)
	}
}

// TestConcurrentReadersAndWriters runs Match and PATCH together (go test -race).
func TestConcurrentReadersAndWriters(t *testing.T) {
	s := open(t, t.TempDir())
	call(t, s, "POST", "/credential-vault", createBody)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				s.Match(sbx, Request{"https", "api.github.com", 443, "GET", "/repos/a"})
				s.Intercepts(sbx, "https", "api.github.com", 443)
			}
		}()
	}
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf(`{"credentials":{"replace":[{"name":"gh","source":{"type":"inline","value":"v%d"}}]}}`, i)
		if code, b := call(t, s, "PATCH", "/credential-vault", body); code != 200 {
			t.Fatalf("patch %d: %d %s", i, code, b)
		}
	}
	wg.Wait()
	if inj, _ := s.Match(sbx, Request{"https", "api.github.com", 443, "GET", "/repos/a"}); inj.Headers[0].Value != "Bearer v19" {
		t.Errorf("last write not visible: %+v", inj)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCopyVault: a copy serves the same injections under its own CA, survives the
// source's delete and a reopen, and copying from a holder without a vault is a no-op.
func TestCopyVault(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	body := `{"credentials":[{"name":"a","source":{"type":"inline","value":"AAA"}}],
	 "bindings":[{"name":"exact","match":{"hosts":["api.example"]},"auth":{"type":"bearer","credential":"a"}}]}`
	if code, b := call(t, s, "POST", "/credential-vault", body); code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	q := Request{"https", "api.example", 443, "GET", "/x"}
	if err := s.CopyVault(sbx, "snap-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(sbx); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyVault("snap-1", "restored"); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyVault("nobody", "other"); err != nil || s.Intercepts("other", "https", "api.example", 443) {
		t.Fatalf("copy from a holder without a vault: %v", err)
	}
	for _, st := range []*Store{s, open(t, dir)} {
		inj, ok := st.Match("restored", q)
		if !ok || inj.Binding != "exact" || fmt.Sprint(inj.Headers) != fmt.Sprint([]Header{{"Authorization", "Bearer AAA"}}) {
			t.Errorf("restored vault: %v %+v", ok, inj)
		}
		if _, ok := st.Match(sbx, q); ok {
			t.Error("the deleted source still injects")
		}
	}
	a, _, _, _ := s.CA("snap-1")
	b, _, _, _ := s.CA("restored")
	if a.Equal(b) {
		t.Error("the copy shares its CA with the snapshot")
	}
}
