package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd/execdtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	execdtest.Cleanup()
	os.Exit(code)
}

// testCA is a fresh self-signed CA certificate in PEM.
func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestInstallBinary runs the real execd the way the Kubernetes init container does:
// --install copies it (mode 0755, identical bytes) and the copy runs.
func TestInstallBinary(t *testing.T) {
	bin := execdtest.Binary(t)
	dst := filepath.Join(t.TempDir(), "execd")
	if out, err := exec.Command(bin, "--install", dst).CombinedOutput(); err != nil {
		t.Fatalf("execd --install: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(bin)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("installed copy differs from execd (err %v)", err)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode().Perm())
	}
	if _, err := os.Stat(dst + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	out, err := exec.Command(dst, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "execd ") {
		t.Fatalf("installed execd --version: %v %q", err, out)
	}
	// A folder that does not exist: an error, nothing written.
	if out, err := exec.Command(bin, "--install", filepath.Join(t.TempDir(), "missing", "execd")).CombinedOutput(); err == nil {
		t.Fatalf("--install into a missing folder succeeded: %s", out)
	}
}

// TestInstallTrustBinary: --install-trust reads the CA from $AIRLOCK_TRUSTED_CA.
func TestInstallTrustBinary(t *testing.T) {
	bin := execdtest.Binary(t)
	ca := testCA(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--install-trust", dir)
	cmd.Env = append(os.Environ(), "AIRLOCK_TRUSTED_CA="+string(ca))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("execd --install-trust: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, trustBundleName))
	if err != nil || !bytes.HasSuffix(got, ca) {
		t.Fatalf("bundle does not end with the CA (err %v)", err)
	}
	cmd = exec.Command(bin, "--install-trust", t.TempDir())
	cmd.Env = append(os.Environ(), "AIRLOCK_TRUSTED_CA=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no certificate") {
		t.Fatalf("--install-trust without a CA: %v %s", err, out)
	}
}

func TestInstallTrust(t *testing.T) {
	ca := testCA(t)
	sysDir := t.TempDir()
	sys := filepath.Join(sysDir, "ca-certificates.crt")
	other := testCA(t)
	if err := os.WriteFile(sys, bytes.TrimSuffix(other, []byte("\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		sys        string
		ca         []byte
		wantBundle []byte
		wantErr    string
	}{
		{name: "appended_to_system_bundle", sys: sys, ca: ca, wantBundle: append(append([]byte{}, other...), ca...)},
		{name: "no_system_bundle", sys: filepath.Join(sysDir, "missing"), ca: ca, wantBundle: ca},
		{name: "two_certificates", sys: filepath.Join(sysDir, "missing"), ca: append(append([]byte{}, ca...), other...),
			wantBundle: append(append([]byte{}, ca...), other...)},
		{name: "empty", sys: sys, ca: nil, wantErr: "no certificate"},
		{name: "not_pem", sys: sys, ca: []byte("hello"), wantErr: "not PEM"},
		{name: "trailing_garbage", sys: sys, ca: append(append([]byte{}, ca...), "junk"...), wantErr: "not PEM"},
		{name: "private_key", sys: sys, ca: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), wantErr: "PRIVATE KEY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			err := installTrust(dir, tc.sys, tc.ca)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Errorf("files written on error: %v", ents)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			bundle, _ := os.ReadFile(filepath.Join(dir, trustBundleName))
			if !bytes.Equal(bundle, tc.wantBundle) {
				t.Errorf("bundle:\n%s\nwant:\n%s", bundle, tc.wantBundle)
			}
			extra, _ := os.ReadFile(filepath.Join(dir, trustExtraName))
			if !bytes.Equal(extra, tc.ca) {
				t.Errorf("extra CA file %q, want the CA alone", extra)
			}
			if !x509.NewCertPool().AppendCertsFromPEM(bundle) {
				t.Error("bundle does not parse as certificates")
			}
		})
	}
}
