package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/sdk"
)

// TestVault drives the Go SDK's Credential Vault calls against a real lifecycle server
// (server proxy, port 18080) with a real vault store: a sandbox without
// credentialProxy is refused (412), one with it gets create, get, patch, delete; no
// answer carries the value.
func TestVault(t *testing.T) {
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := lctest.New(t, lctest.Options{APIKey: key, CredentialVault: store})
	c := newClient(t, h, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	policy := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"api.example.com"}]}`)
	const secret = "sdk-vault-SECRET-1"
	req := vault.CreateRequest{
		Credentials: []vault.Credential{{Name: "tok", Source: vault.Source{Type: "inline", Value: secret}}},
		Bindings: []vault.Binding{{Name: "api", Match: vault.Match{Hosts: []string{"api.example.com"}},
			Auth: vault.Auth{Type: "bearer", Credential: "tok"}}},
	}

	plain, err := c.Create(ctx, sdk.CreateRequest{Image: h.Image, Timeout: 5 * time.Minute, NetworkPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Vault(ctx, plain.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Create(ctx, req); !isStatus(err, 412) {
		t.Errorf("vault of a sandbox without credentialProxy: %v, want 412", err)
	}

	sb, err := c.Create(ctx, sdk.CreateRequest{Image: h.Image, Timeout: 5 * time.Minute, NetworkPolicy: policy, CredentialProxy: true})
	if err != nil {
		t.Fatal(err)
	}
	if v, err = c.Vault(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	st, err := v.Create(ctx, req)
	if err != nil || st.Revision != 1 || len(st.Bindings) != 1 || st.Bindings[0].Match.Ports[0] != 443 {
		t.Fatalf("create: %+v %v", st, err)
	}
	if inj, ok := store.Match(sb.ID, vault.Request{Scheme: "https", Host: "api.example.com", Port: 443, Method: "GET", Path: "/x"}); !ok || inj.Headers[0].Value != "Bearer "+secret {
		t.Errorf("the store does not inject after the SDK's create: %+v", inj)
	}
	rev := int64(1)
	st, err = v.Patch(ctx, vault.MutationRequest{ExpectedRevision: &rev, Bindings: vault.BindingMutation{Delete: []string{"api"}}})
	if err != nil || st.Revision != 2 || len(st.Bindings) != 0 {
		t.Fatalf("patch: %+v %v", st, err)
	}
	if b, _ := json.Marshal(st); strings.Contains(string(b), secret) {
		t.Errorf("state carries the secret: %s", b)
	}
	if err := v.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Get(ctx); !sdk.IsNotFound(err) {
		t.Errorf("get after delete: %v, want 404", err)
	}
	before, _, _, _ := store.CA(sb.ID)
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Deleting the sandbox forgot its CA: asking again makes a new one.
	if after, _, _, _ := store.CA(sb.ID); after.Equal(before) {
		t.Error("the sandbox's vault and CA outlived its deletion")
	}
	store.Delete(sb.ID)
}

func isStatus(err error, code int) bool {
	var ae *sdk.APIError
	return errors.As(err, &ae) && ae.Status == code
}
