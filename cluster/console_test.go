package cluster_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/internal/kubetest"
)

// TestReplicaServesConsole runs real control-plane replicas (a real kube-apiserver with
// Airlock's CRDs): the API listener serves the operator console under /console/ by
// default, where the configured key and a user key made through /v1/keys sign in (the
// replica's key store); the user is refused the audit pages (403, the role first) and
// the admin gets 501 (no audit log beside lifecycle on Kubernetes). With
// Console.Disabled (`airlock lifecycle --no-console`) /console/login is the API's own
// answer (401 without a key, 404 with it) and the API is served as before.
func TestReplicaServesConsole(t *testing.T) {
	env := kubetest.Start(t, kubetest.AirlockCRDs())
	const apiKey = "console-test-key"
	start := func(name string, cc cluster.ConsoleConfig) string {
		cp, err := cluster.Start(t.Context(), cluster.Config{
			Kube: env.Config, Listen: "127.0.0.1:0", Namespace: env.Namespace(t, "sbx"), SystemNamespace: env.Namespace(t, "sys"),
			ExecdImage: "airlock/execd:test", APIKey: apiKey, Identity: name, LeaseDuration: 2 * time.Second,
			Console: cc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.Close() })
		return "http://" + cp.Addr.String()
	}

	base := start("with-console", cluster.ConsoleConfig{})
	if code, body := get(t, http.DefaultClient, base+"/console/login"); code != 200 || !strings.Contains(body, `name="key"`) {
		t.Fatalf("GET /console/login: %d, want the sign-in page:\n%s", code, body)
	}
	admin := signIn(t, base, apiKey)
	if code, body := get(t, admin, base+"/console/api/session"); code != 200 || !strings.Contains(body, `"role":"admin"`) {
		t.Fatalf("the admin's session: %d %s", code, body)
	}
	if code, body := get(t, admin, base+"/console/api/v1/sandboxes"); code != 200 {
		t.Fatalf("sandboxes through the console: %d %s", code, body)
	}
	if code, body := get(t, admin, base+"/console/api/audit"); code != 501 {
		t.Fatalf("audit search as the admin on Kubernetes: %d %s, want 501", code, body)
	}

	code, bob, err := postKey(t, base, apiKey, "bob", "user")
	if code != 201 && code != 200 || err != nil || bob.Key == "" {
		t.Fatalf("POST /v1/keys: %d %v", code, err)
	}
	user := signIn(t, base, bob.Key)
	if code, body := get(t, user, base+"/console/api/session"); code != 200 || !strings.Contains(body, `"role":"user"`) {
		t.Fatalf("the user's session: %d %s", code, body)
	}
	for _, p := range []string{"/console/api/audit", "/console/api/audit/verify", "/console/api/stats"} {
		if code, body := get(t, user, base+p); code != 403 {
			t.Errorf("%s as a user: %d %s, want 403", p, code, body)
		}
	}

	off := start("without-console", cluster.ConsoleConfig{Disabled: true})
	if code, body := get(t, http.DefaultClient, off+"/console/login"); code != 401 || !strings.Contains(body, "UNAUTHORIZED") {
		t.Fatalf("GET /console/login with the console off: %d, want the API's 401:\n%s", code, body)
	}
	if code, body := getWithKey(t, off+"/console/login", apiKey); code != 404 {
		t.Fatalf("GET /console/login with the key and the console off: %d, want the API's 404:\n%s", code, body)
	}
	if code, body := getWithKey(t, off+"/v1/sandboxes", apiKey); code != 200 {
		t.Fatalf("GET /v1/sandboxes with the console off: %d %s", code, body)
	}
}

// getWithKey returns the status and body of GET u with the API key.
func getWithKey(t *testing.T, u, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// signIn signs in to the console at base with key as a browser would (its own Origin)
// and returns a client holding the session cookie.
func signIn(t *testing.T, base, key string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("POST", base+"/console/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 303 {
		t.Fatalf("POST /console/login: %d, want 303", resp.StatusCode)
	}
	return c
}

// postKey makes a key through the API with the configured key: the status, the
// created key's id and value, and the error decoding them.
func postKey(t *testing.T, base, apiKey, name, role string) (int, struct{ ID, Key string }, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/keys", strings.NewReader(`{"name":"`+name+`","role":"`+role+`"}`))
	req.Header.Set("OPEN-SANDBOX-API-KEY", apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var created struct{ ID, Key string }
	err = json.NewDecoder(resp.Body).Decode(&created)
	return resp.StatusCode, created, err
}

// get returns the status and body of GET u.
func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
