package vault

import (
	"testing"
)

// TestImportCA: a CA made elsewhere (NewCA, as lifecycle on Kubernetes does) becomes
// the sandbox's CA, sealed and reopened; importing it again is a no-op, another CA
// replaces it and keeps the vault; a key that is not the certificate's is refused.
func TestImportCA(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	must(t, err)
	der, key, err := NewCA(sbx)
	must(t, err)
	must(t, s.ImportCA(sbx, der, key))
	must(t, s.ImportCA(sbx, der, key))
	cert, _, _, err := s.CA(sbx)
	must(t, err)
	if string(cert.Raw) != string(der) || !cert.IsCA {
		t.Fatal("CA after ImportCA is not the imported certificate")
	}
	if code, body := call(t, s, "POST", "/credential-vault", createBody); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	der2, key2, err := NewCA(sbx)
	must(t, err)
	if err := s.ImportCA(sbx, der2, key); err == nil {
		t.Error("ImportCA took a key that is not the certificate's")
	}
	must(t, s.ImportCA(sbx, der2, key2))
	s2, err := Open(dir, nil)
	must(t, err)
	if c2, _, _, _ := s2.CA(sbx); string(c2.Raw) != string(der2) {
		t.Error("reopened store has another CA than the last imported")
	}
	if _, ok := s2.Match(sbx, Request{"https", "api.github.com", 443, "GET", "/repos/a"}); !ok {
		t.Error("replacing the CA lost the vault's bindings")
	}
}
