package audit

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateSigningKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "audit")
	priv, pub := DefaultKeyFiles(dir + "/")
	if priv != dir+".key" || pub != dir+".pub" || PublicKeyFile(priv) != pub {
		t.Fatalf("key files %s %s (public of %s: %s)", priv, pub, priv, PublicKeyFile(priv))
	}
	key, created, err := LoadOrCreateSigningKey(priv, pub)
	if err != nil || !created {
		t.Fatalf("first start: created %v, %v", created, err)
	}
	if st, err := os.Stat(priv); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("signing key file: %v %v, want mode 0600", st, err)
	}
	p, err := LoadPublicKey(pub)
	if err != nil || !p.Equal(key.Public()) {
		t.Fatalf("public key file: %v, does not match the signing key", err)
	}
	again, created, err := LoadOrCreateSigningKey(priv, pub)
	if err != nil || created || !again.Equal(key) {
		t.Fatalf("second start: created %v, same key %v, %v", created, again.Equal(key), err)
	}
	// A lost public key is written again from the signing key.
	os.Remove(pub)
	if _, _, err := LoadOrCreateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	if p, _ := LoadPublicKey(pub); !p.Equal(key.Public()) {
		t.Fatal("public key not restored")
	}
	// Another key's public key beside it is refused, not overwritten.
	other := filepath.Join(t.TempDir(), "other")
	if err := GenerateKeyFiles(other+".key", other+".pub"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateSigningKey(other+".key", pub); err == nil || !strings.Contains(err.Error(), "is not the public key") {
		t.Fatalf("mismatched public key: %v", err)
	}
}

// TestVerifyUnsignedBefore: a log that was written unsigned and then signed verifies
// with UnsignedBefore (with a warning), and not without it; an unsigned checkpoint
// after a signed one breaks the chain either way.
func TestVerifyUnsignedBefore(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir := t.TempDir()
	write := func(key ed25519.PrivateKey) {
		w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 4096, SigningKey: key})
		for i := range 100 {
			w.Append(rec("sb", i))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(nil)
	write(priv)
	if _, err := Verify(dir, VerifyOptions{PublicKey: pub}); !errors.Is(err, ErrBroken) {
		t.Fatalf("unsigned checkpoints passed a strict verify: %v", err)
	}
	rep, err := Verify(dir, VerifyOptions{PublicKey: pub, UnsignedBefore: true})
	if err != nil || rep.VerifiedSignatures == 0 || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "not signed") {
		t.Fatalf("unsigned prefix: %+v, %v", rep, err)
	}
	write(nil)
	if _, err := Verify(dir, VerifyOptions{PublicKey: pub, UnsignedBefore: true}); !errors.Is(err, ErrBroken) {
		t.Fatalf("an unsigned checkpoint after a signed one verified: %v", err)
	}
}
