package egressd

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestVaultCopyAPI: the node vault's copy (POST /v1/vault/copy) answers only the API
// key; a bad body or a pair other than one sandbox this node runs and one snapshot id
// is a 400 JSON error, an unknown sandbox 404; a sandbox's vault copied to a snapshot
// survives the source's deletion and, copied on to another sandbox, injects the secret
// there while its vault API shows the binding without the value; no answer ever holds
// the secret; the snapshot's copy is not readable as a sandbox's vault and goes with
// the snapshot's image.
func TestVaultCopyAPI(t *testing.T) {
	const key, secret, snap = "node-key", "copy-SECRET-value-1", "snap-abc123"
	dir := t.TempDir()
	store, err := vault.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"api.example.com"}]}`)
	d := &Daemon{log: slog.New(slog.DiscardHandler), cfg: Config{Vault: store}, byID: map[string]*sandbox{
		"srcsbx":  {view: watch.Sandbox{ID: "srcsbx", Policy: policy}},
		"restsbx": {view: watch.Sandbox{ID: "restsbx", Policy: policy}},
	}}
	h := d.VaultHandler(store, key)
	call := func(method, path, sentKey, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if sentKey != "" {
			req.Header.Set(opensandbox.HeaderAPIKey, sentKey)
		}
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if strings.Contains(rec.Body.String(), secret) {
			t.Errorf("%s %s answered the secret: %s", method, path, rec.Body)
		}
		return rec
	}
	create, _ := json.Marshal(vault.CreateRequest{
		Credentials: []vault.Credential{{Name: "api", Source: vault.Source{Type: "inline", Value: secret}}},
		Bindings:    []vault.Binding{{Name: "api", Match: vault.Match{Hosts: []string{"api.example.com"}}, Auth: vault.Auth{Type: "bearer", Credential: "api"}}},
	})
	if _, _, _, err := store.CA("srcsbx"); err != nil { // lifecycle's import at create
		t.Fatal(err)
	}
	if rec := call(http.MethodPost, watch.VaultPath+"srcsbx/credential-vault", key, string(create)); rec.Code != http.StatusCreated {
		t.Fatalf("creating the source's vault: %d %s", rec.Code, rec.Body)
	}

	copyBody := func(from, to string) string {
		b, _ := json.Marshal(watch.VaultCopy{From: from, To: to})
		return string(b)
	}
	for _, c := range []struct {
		name, key, body string
		want            int
	}{
		{"NoKey", "", copyBody("srcsbx", snap), http.StatusUnauthorized},
		{"WrongKey", "other", copyBody("srcsbx", snap), http.StatusUnauthorized},
		{"NotJSON", key, `{"from":`, http.StatusBadRequest},
		{"UnknownField", key, `{"from":"srcsbx","to":"` + snap + `","values":true}`, http.StatusBadRequest},
		{"Empty", key, `{}`, http.StatusBadRequest},
		{"SandboxToSandbox", key, copyBody("srcsbx", "restsbx"), http.StatusBadRequest},
		{"SnapshotToSnapshot", key, copyBody(snap, "snap-other"), http.StatusBadRequest},
		{"SameSnapshot", key, copyBody(snap, snap), http.StatusBadRequest},
		{"BadSnapshotID", key, copyBody("srcsbx", "snap-../../node"), http.StatusBadRequest},
		{"UpperSnapshotID", key, copyBody("srcsbx", "snap-ABC"), http.StatusBadRequest},
		{"UnknownSandbox", key, copyBody("elsewhere", snap), http.StatusNotFound},
		{"UnknownRestore", key, copyBody(snap, "elsewhere"), http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := call(http.MethodPost, watch.VaultPath+"copy", c.key, c.body)
			var e opensandbox.ErrorBody
			if rec.Code != c.want || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Code == "" || e.Message == "" {
				t.Errorf("%d %q, want %d with a JSON error", rec.Code, rec.Body, c.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, snap+".vault")); !os.IsNotExist(err) {
		t.Fatalf("a refused copy made the snapshot's vault file: %v", err)
	}

	// Capture: the source's vault to the snapshot; then the source goes.
	if rec := call(http.MethodPost, watch.VaultPath+"copy", key, copyBody("srcsbx", snap)); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("copy to the snapshot: %d %q, want 204 without a body", rec.Code, rec.Body)
	}
	if rec := call(http.MethodDelete, watch.VaultPath+"srcsbx", key, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("deleting the source's vault: %d %s", rec.Code, rec.Body)
	}
	if rec := call(http.MethodGet, watch.VaultPath+snap+"/credential-vault", key, ""); rec.Code != http.StatusNotFound {
		t.Errorf("the snapshot's copy is readable as a sandbox's vault: %d %s", rec.Code, rec.Body)
	}
	raw, err := os.ReadFile(filepath.Join(dir, snap+".vault"))
	if err != nil || strings.Contains(string(raw), secret) {
		t.Fatalf("the snapshot's copy on disk: %v (sealed: %v)", err, !strings.Contains(string(raw), secret))
	}

	// Restore: the snapshot's copy to the new sandbox.
	restCA, _, _, err := store.CA("restsbx")
	if err != nil {
		t.Fatal(err)
	}
	if rec := call(http.MethodPost, watch.VaultPath+"copy", key, copyBody(snap, "restsbx")); rec.Code != http.StatusNoContent {
		t.Fatalf("copy to the restored sandbox: %d %s", rec.Code, rec.Body)
	}
	if now, _, _, _ := store.CA("restsbx"); !now.Equal(restCA) {
		t.Error("the copy replaced the restored sandbox's own CA")
	}
	rec := call(http.MethodGet, watch.VaultPath+"restsbx/credential-vault", key, "")
	var st vault.State
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &st) != nil || len(st.Bindings) != 1 || st.Bindings[0].Name != "api" {
		t.Errorf("the restored sandbox's vault: %d %s, want the binding api", rec.Code, rec.Body)
	}
	inj, ok := store.Match("restsbx", vault.Request{Scheme: "https", Host: "api.example.com", Port: 443, Method: "GET", Path: "/"})
	if !ok || len(inj.Headers) != 1 || inj.Headers[0].Value != "Bearer "+secret {
		t.Errorf("the restored sandbox's request gets %+v (%v), want the bearer secret", inj.Binding, ok)
	}

	// The snapshot's image removed: its copy goes too; another holder's stays.
	d.forgetSnapshotVault(watch.SnapshotRefPrefix + "node-1:" + snap)
	if _, err := os.Stat(filepath.Join(dir, snap+".vault")); !os.IsNotExist(err) {
		t.Errorf("the snapshot's vault copy outlives its image: %v", err)
	}
	if _, ok := store.Match("restsbx", vault.Request{Scheme: "https", Host: "api.example.com", Port: 443, Method: "GET", Path: "/"}); !ok {
		t.Error("removing the snapshot's image dropped the restored sandbox's vault")
	}
}
