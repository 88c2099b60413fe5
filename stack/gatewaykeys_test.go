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
