package kubestore_test

import (
	"testing"

	"github.com/airlockdev/airlock/internal/kubetest"
)

// TestSnapshotRecords: a snapshot record one replica writes (a Secret in the token
// namespace) is read by another at once, replaced in place, and gone for both once
// deleted; the access-token Secrets are not snapshots.
func TestSnapshotRecords(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "kubestore")
	a, b := newStore(t, env, ns, "a"), newStore(t, env, ns, "b")
	if err := a.PutSandbox("s1abc", []byte(`{"id":"s1abc","image":"x","entrypoint":["sh"],"metadata":{},`+
		`"createdAt":"2026-11-25T10:00:00Z","status":{"state":"Pending"},"accessToken":"tok"}`)); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{`{"id":"snap-a","status":{"state":"Creating"}}`, `{"id":"snap-a","status":{"state":"Ready"}}`} {
		if err := a.PutSnapshot("snap-a", []byte(doc)); err != nil {
			t.Fatal(err)
		}
		got, err := b.Snapshots()
		if err != nil || len(got) != 1 || string(got["snap-a"]) != doc {
			t.Fatalf("Snapshots on the other replica = %q, %v; want only snap-a = %s", got, err, doc)
		}
	}
	if err := b.DeleteSnapshot("snap-a"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSnapshot("snap-a"); err != nil {
		t.Fatalf("deleting a missing snapshot: %v", err)
	}
	if got, err := a.Snapshots(); err != nil || len(got) != 0 {
		t.Fatalf("Snapshots after the delete = %q, %v; want none", got, err)
	}
}
