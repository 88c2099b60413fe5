package principal

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRoleAllows pins the role table: what each role may do.
func TestRoleAllows(t *testing.T) {
	want := map[Role][]Action{
		Admin:    {ReadSandbox, WriteSandbox, UseSandbox, ReadAudit, ReadPolicies, ManageKeys, Internal},
		Operator: {ReadSandbox, WriteSandbox, UseSandbox, ReadAudit, ReadPolicies},
		Auditor:  {ReadSandbox, ReadAudit, ReadPolicies},
		User:     {ReadSandbox, WriteSandbox, UseSandbox},
	}
	for _, r := range Roles {
		for a := ReadSandbox; a <= Internal; a++ {
			allowed := false
			for _, w := range want[r] {
				allowed = allowed || w == a
			}
			if r.Allows(a) != allowed {
				t.Errorf("%s may %s: %v, want %v", r, a, r.Allows(a), allowed)
			}
		}
	}
	if Role("root").Allows(ReadSandbox) || User.OwnsAll() || !Auditor.OwnsAll() {
		t.Error("unknown role allowed, or OwnsAll wrong")
	}
}

// TestKeyringSharedStore: two keyrings on one store (two lifecycle replicas): a key made
// on one works on the other after its next reload, and a key revoked or rotated on one
// stops working on the other within 1 s (Follow every 200 ms); the store holds only
// hashes.
func TestKeyringSharedStore(t *testing.T) {
	store := &memStore{m: map[string][]byte{}}
	a, err := NewKeyring(store, "configured-key", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewKeyring(store, "configured-key", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go b.Follow(ctx, 200*time.Millisecond)

	if p, ok := a.Authenticate("configured-key"); !ok || p.ID != ConfiguredAdminID || p.Role != Admin {
		t.Fatalf("configured key: %+v %v", p, ok)
	}
	c, err := a.Create(CreateRequest{Name: "agent", Role: User})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := a.Authenticate(c.Key); !ok || p.ID != c.ID || p.Role != User || p.Name != "agent" {
		t.Fatalf("new key on its keyring: %+v %v", p, ok)
	}
	for _, doc := range must(store.Keys()) {
		if strings.Contains(string(doc), c.Key) || strings.Contains(string(doc), c.Key[3:]) {
			t.Fatalf("the store holds the raw key: %s", doc)
		}
	}
	waitFor(t, "the new key on the other replica", func() bool { _, ok := b.Authenticate(c.Key); return ok })

	r, err := a.Rotate(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Authenticate(c.Key); ok {
		t.Fatal("the rotated-away key still works on its keyring")
	}
	waitFor(t, "the rotated-away key refused on the other replica", func() bool { _, ok := b.Authenticate(c.Key); return !ok })
	waitFor(t, "the rotated key on the other replica", func() bool { _, ok := b.Authenticate(r.Key); return ok })

	if err := a.Revoke(c.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "the revoked key refused on the other replica", func() bool { _, ok := b.Authenticate(r.Key); return !ok })
	if d := time.Since(start); d > time.Second {
		t.Fatalf("revocation took %s on the other replica, want under 1 s", d)
	}
	if err := a.Revoke(ConfiguredAdminID); err != ErrConfigured {
		t.Fatalf("revoking the configured key: %v", err)
	}
	if _, err := a.Create(CreateRequest{Name: " ", Role: User}); err == nil {
		t.Fatal("an empty name was accepted")
	}
	if _, err := a.Create(CreateRequest{Name: "x", Role: "root"}); err == nil {
		t.Fatal("an unknown role was accepted")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 1 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
