package kubestore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/lifecycle/kubestore"
	"github.com/airlockdev/airlock/principal"
)

// TestKeysAcrossReplicas: two replicas' keyrings on one cluster store: a key made
// through one works on the other after its refresh, and revoking it through one makes
// the other refuse it within 1 s (refresh every 500 ms, lifecycle's default with a
// shared store); the Secret holds only the key's hash.
func TestKeysAcrossReplicas(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "keys")
	a, err := principal.NewKeyring(newStore(t, env, ns, "a"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := principal.NewKeyring(newStore(t, env, ns, "b"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go b.Follow(ctx, 500*time.Millisecond)

	c, err := a.Create(principal.CreateRequest{Name: "ci", Role: principal.Operator})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the new key on replica b", func() bool { _, ok := b.Authenticate(c.Key); return ok })
	sec, err := env.Client.CoreV1().Secrets(ns).Get(t.Context(), kubestore.KeysSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if doc := string(sec.Data[c.ID]); !strings.Contains(doc, principal.Hash(c.Key)) || strings.Contains(doc, c.Key) {
		t.Fatalf("the keys Secret holds %q: want the hash and never the key", doc)
	}
	if err := a.Revoke(c.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the revoked key refused on replica b", func() bool { _, ok := b.Authenticate(c.Key); return !ok })
}

func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
