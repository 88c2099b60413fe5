package execdtoken

import (
	"path/filepath"
	"testing"
)

func TestDerive(t *testing.T) {
	k := Key([]byte("0123456789abcdef0123456789abcdef"))
	a, b := k.Derive("sbx-a"), k.Derive("sbx-b")
	if len(a) != 43 || a == b || a != k.Derive("sbx-a") {
		t.Fatalf("tokens %q %q", a, b)
	}
	if !k.Matches("sbx-a", a) || k.Matches("sbx-b", a) || k.Matches("sbx-a", "") {
		t.Fatal("Matches")
	}
	if Key(nil).Derive("x") != "" || Key(nil).Matches("x", "") {
		t.Fatal("empty key derives")
	}
	k2, err := ParseKey(k.String())
	if err != nil || k2.Derive("sbx-a") != a {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"", "plain", "hex:zz", "base64:c2hvcnQ="} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

func TestLoadOrCreate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "execd-key")
	k1, err := LoadOrCreate(p)
	if err != nil || len(k1) != KeySize {
		t.Fatalf("create: %v", err)
	}
	k2, err := LoadOrCreate(p)
	if err != nil || k2.String() != k1.String() {
		t.Fatalf("reload: %v", err)
	}
}
