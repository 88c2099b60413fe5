package stack

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
	"github.com/airlockdev/airlock/sdk"
)

// TestGatewayAdmitsPrincipalKeys: at the gateway, on a sandbox's execd port, any API key
// lifecycle knows is admitted by its role as the lifecycle API admits it: the admin and
// an operator key on every sandbox, a user key on the sandbox it created and "not
// found" on another user's, an auditor key on none (403); an unknown key is 401; a
// revoked key stops working within a second. Admissions by a principal's key are
// audited with the principal, never the key.
func TestGatewayAdmitsPrincipalKeys(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	s, admin := startTestStack(t, func(cfg *Config) { cfg.Egress.Disabled = true })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	keys := map[string]*principal.Created{}
	for name, role := range map[string]principal.Role{"alice": principal.User, "bob": principal.User,
		"olga": principal.Operator, "aldo": principal.Auditor} {
		k, err := admin.CreateKey(ctx, name, role)
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = k
	}
	alice, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: keys["alice"].Key})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := alice.Create(ctx, sdk.CreateRequest{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.WaitState(ctx, sb.ID, opensandbox.Running, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ep, err := alice.Endpoint(ctx, sb.ID, opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	ping := func(key string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL("http")+"/ping", nil)
		if key != "" {
			req.Header.Set(opensandbox.HeaderAPIKey, key) // the key only: no access or execd token
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		who, key string
		want     int
	}{
		{"the configured admin key", s.APIKey, 200},
		{"alice (user, the creator)", keys["alice"].Key, 200},
		{"olga (operator)", keys["olga"].Key, 200},
		{"bob (another user)", keys["bob"].Key, 404},
		{"aldo (auditor)", keys["aldo"].Key, 403},
		{"an unknown key", principal.NewKey(), 401},
		{"no key", "", 401},
	} {
		if got, body := ping(c.key); got != c.want {
			t.Errorf("%s: GET /ping through the gateway = %d %s, want %d", c.who, got, body, c.want)
		}
	}
	if err := admin.RevokeKey(ctx, keys["alice"].ID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for {
		got, _ := ping(keys["alice"].Key)
		if got == 401 {
			break
		}
		if time.Since(revoked) > 1200*time.Millisecond {
			t.Fatalf("alice's revoked key still admitted %v after the revocation (%d)", time.Since(revoked), got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The admissions by olga's key are on record with her principal id, and no key
	// appears in the log.
	time.Sleep(300 * time.Millisecond)
	var olga bool
	if err := audit.Scan(s.AuditDir(), audit.Filter{SandboxID: sb.ID}, func(r audit.Record) error {
		if r.Source == audit.SourceGateway && r.Reason == "principal_key" && r.Extra["principal"] == keys["olga"].ID {
			olga = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !olga {
		t.Error("no gateway record of olga's admission naming her principal")
	}
	if err := filepath.WalkDir(s.AuditDir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		for _, k := range keys {
			if strings.Contains(string(b), k.Key) {
				t.Errorf("%s holds %s's key", path, k.Name)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayEgressAPIAsCaller: a user's call to its sandbox's egress API (port 18080)
// through the gateway, admitted by the user's own key, reaches lifecycle as that user:
// the control record of the policy change names the user's principal, not the
// gateway's; the sandbox's access token still works and is recorded as the gateway's.
func TestGatewayEgressAPIAsCaller(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	s, admin := startTestStack(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	alice, err := admin.CreateKey(ctx, "alice", principal.User)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: alice.Key})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := ac.Create(ctx, sdk.CreateRequest{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ac.WaitState(ctx, sb.ID, opensandbox.Running, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ep, err := ac.Endpoint(ctx, sb.ID, opensandbox.EgressAPIPort)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(target string, hdr map[string]string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, ep.URL("http")+"/policy",
			strings.NewReader(`[{"action":"allow","target":"`+target+`"}]`))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("PATCH /policy (%s) through the gateway: %d %s", target, resp.StatusCode, b)
		}
		return resp.StatusCode
	}
	patch("alice.example", map[string]string{opensandbox.HeaderAPIKey: alice.Key}) // the key only
	patch("token.example", ep.Headers)                                             // the sandbox's access token
	want := map[string]string{"alice.example": alice.ID, "token.example": "gateway"}
	got := map[string]string{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		var patches []audit.Record
		if err := audit.Scan(s.AuditDir(), audit.Filter{SandboxID: sb.ID}, func(r audit.Record) error {
			if r.Source == audit.SourceControl && r.Extra["op"] == "egress.policy.patch" {
				patches = append(patches, r)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(patches) == 2 {
			got["alice.example"], _ = patches[0].Extra["principal"].(string)
			got["token.example"], _ = patches[1].Extra["principal"].(string)
		}
	}
	for target, who := range want {
		if got[target] != who {
			t.Errorf("the egress API call adding %s is recorded as principal %q, want %q", target, got[target], who)
		}
	}
}
