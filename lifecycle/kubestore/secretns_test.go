package kubestore_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/lifecycle/kubestore"
)

// TestTokensInTheirOwnNamespace: with SecretNamespace set, the access-token Secrets are
// written, followed (a token arriving at another replica completes its document),
// listed and deleted there, and none is in the state's namespace.
func TestTokensInTheirOwnNamespace(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns, tok := env.Namespace(t, "kubestore"), env.Namespace(t, "tokens")
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	store := func(id string) *kubestore.Store {
		st, err := kubestore.New(kubestore.Config{Client: env.Client, Dynamic: dyn, Namespace: ns, SecretNamespace: tok,
			Identity: id, LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	a, b := store("a"), store("b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seenB := &applied{docs: map[string][]byte{}}
	if err := b.Follow(ctx, seenB.apply); err != nil {
		t.Fatal(err)
	}
	doc := `{"id":"t1abc","image":"debian:12","createdAt":"2026-11-25T10:00:00Z","accessToken":"tok-in-its-namespace"}`
	if err := a.PutSandbox("t1abc", []byte(doc)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica b to see t1abc with its token", func() bool {
		m, ok := seenB.get("t1abc")
		return ok && m["accessToken"] == "tok-in-its-namespace"
	})
	if _, err := env.Client.CoreV1().Secrets(tok).Get(ctx, "airlock-access-t1abc", metav1.GetOptions{}); err != nil {
		t.Errorf("the access-token Secret in %s: %v", tok, err)
	}
	if l, err := env.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("Secrets in the state's namespace %s: %v %v", ns, l, err)
	}
	all, err := store("c").Sandboxes()
	if err != nil || !contains(all["t1abc"], `"accessToken":"tok-in-its-namespace"`) {
		t.Errorf("a new replica lists %s, %v", all["t1abc"], err)
	}
	if err := a.DeleteSandbox("t1abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Secrets(tok).Get(ctx, "airlock-access-t1abc", metav1.GetOptions{}); err == nil {
		t.Error("the access-token Secret outlived its sandbox")
	}
}
