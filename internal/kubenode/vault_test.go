package kubenode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// testCA is the CA of the project-owned HTTPS server the vault check talks to, which
// the node's egressd trusts for intercepted upstreams.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// trustTestCA makes a test CA and has AirlockUp's airlock-up.sh make egressd trust it
// for intercepted upstreams (AIRLOCK_KUBE_UPSTREAM_CA: the script copies the file into
// egressd's hostPath folder and adds --upstream-ca-file naming it to the DaemonSet it
// applies): only this test's deployment trusts it, and down.sh removes it with the
// node's state. Call it before AirlockUp.
func trustTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubenode test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	f := filepath.Join(t.TempDir(), "test-upstream-ca.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AIRLOCK_KUBE_UPSTREAM_CA", f)
	return &testCA{cert: cert, key: key}
}

// leaf is a server certificate for name signed by ca.
func (ca *testCA) leaf(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// checkVault shows the Credential Vault on the node: a sandbox created with
// credentialProxy through the lifecycle API gets a vault (the egress API, forwarded
// by lifecycle to its node's egressd) binding a bearer credential to name; its
// request to a project-owned HTTPS server at addr:443 (name answered by the cluster
// DNS) is intercepted by egressd's L7 proxy, whose certificate the sandbox trusts
// through the CA its trust init container installed, and arrives with the injected
// Authorization header, while the secret appears nowhere in the sandbox (environment,
// the vault's state). The server runs on this host with addr on the node's bridge.
func checkVault(ctx context.Context, t *testing.T, n *Node, c *sdk.Client, ca *testCA, name, addr string) {
	t.Helper()
	authorizations := vaultUpstream(t, ca, name, addr)

	secret := "kubenode-secret-" + randomHex(t)
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, name)
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, NetworkPolicy: json.RawMessage(policy), CredentialProxy: true,
		Resources: map[string]string{"cpu": "250m", "memory": "256Mi"}, Entrypoint: []string{"tail", "-f", "/dev/null"},
	})
	if err != nil {
		t.Fatalf("create the credentialProxy sandbox: %v", err)
	}
	defer func() { _ = c.Kill(context.Background(), sb.ID) }()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.WaitState(wctx, sb.ID, opensandbox.Running, 250*time.Millisecond); err != nil {
		t.Fatalf("credentialProxy sandbox %s not Running: %v\nAirlock's pods:\n%s\nsandbox pods:\n%s", sb.ID, err,
			podLogs(n, kubedeploy.SystemNamespace, 30), podLogs(n, "airlock-sandboxes", 10))
	}
	v, err := c.Vault(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := v.Create(ctx, vault.CreateRequest{
		Credentials: []vault.Credential{{Name: "api", Source: vault.Source{Type: "inline", Value: secret}}},
		Bindings:    []vault.Binding{{Name: "api", Match: vault.Match{Hosts: []string{name}}, Auth: vault.Auth{Type: "bearer", Credential: "api"}}},
	})
	if err != nil {
		t.Fatalf("creating the vault through the egress API: %v", err)
	}
	if b, _ := json.Marshal(st); strings.Contains(string(b), secret) {
		t.Errorf("the vault's state shows the secret: %s", b)
	}
	// A binding the policy does not cover is refused by the node.
	if _, err := v.Patch(ctx, vault.MutationRequest{Bindings: vault.BindingMutation{Add: []vault.Binding{{
		Name: "other", Match: vault.Match{Hosts: []string{"other.example"}}, Auth: vault.Auth{Type: "bearer", Credential: "api"}}}}}); err == nil {
		t.Errorf("a binding to other.example (outside the policy) was accepted")
	}

	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	run := func(command string) string {
		ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
		if err != nil {
			t.Fatalf("running %q in the vault sandbox: %v", command, err)
		}
		return strings.Join(ex.Stdout, "\n")
	}
	got := run(fmt.Sprintf(`curl -s --max-time 10 --cacert "$SSL_CERT_FILE" https://%s/ 2>&1; echo " rc=$?"`, name))
	seen := authorizations()
	if !strings.HasPrefix(got, "vault-ok") {
		t.Errorf("https://%s/ from the vault sandbox: %q, want the server's vault-ok", name, got)
	}
	if len(seen) != 1 || seen[0] != "Bearer "+secret {
		t.Errorf("the server got Authorization %q, want one request with the injected bearer credential", seen)
	} else {
		t.Logf("vault: https://%s/ from the sandbox: %q; the server got the injected Authorization header", name, got)
	}
	if env := run("env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'"); strings.Contains(env, secret) {
		t.Errorf("the sandbox's environment holds the secret")
	}
}

// vaultUpstream runs, until t ends, a project-owned HTTPS server for name (a leaf of
// ca) at addr:443, with addr on the node's bridge, answering "vault-ok" (never the
// request's headers: the sandbox must not learn the secret); the function it returns
// gives the Authorization header of every request so far.
func vaultUpstream(t *testing.T, ca *testCA, name, addr string) func() []string {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", Bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s dev %s: %v: %s", addr, Bridge, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "addr", "del", addr+"/32", "dev", Bridge).CombinedOutput(); err != nil {
			t.Errorf("ip addr del %s dev %s: %v: %s", addr, Bridge, err, out)
		}
	})
	l, err := net.Listen("tcp4", net.JoinHostPort(addr, "443"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var auths []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, "vault-ok") // never the header: the sandbox must not learn the secret
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, name)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), auths...)
	}
}

// randomHex is 16 random hex digits.
func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
