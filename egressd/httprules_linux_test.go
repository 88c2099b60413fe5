package egressd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/sdk"
)

// rulesIP serves rules.test: a GitHub-like API over HTTPS (a certificate from the
// test's own CA, which only egressd's UpstreamCAPEM trusts) and plain HTTP.
var rulesIP = netip.MustParseAddr("203.0.113.30")

// rulesServer starts rules.test's servers in the internet namespace. Each answers
// "METHOD PATH" and counts the requests that are not GET in writes.
func (w *world) rulesServer(t *testing.T, writes *atomic.Int32) (caPEM []byte) {
	t.Helper()
	datapathtest.IP(t, "-n", w.ns.Name, "addr", "add", rulesIP.String()+"/32", "dev", "lo")
	cert, caPEM := testServerCert(t, "rules.test")
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			writes.Add(1)
		}
		// as Node's http server answers: HTTP/1.1 connection fields, which an HTTP/2
		// answer to the sandbox must not carry
		rw.Header().Set("Connection", "keep-alive")
		rw.Header().Set("Keep-Alive", "timeout=5")
		fmt.Fprintf(rw, "%s %s", r.Method, r.URL.Path)
	})
	for _, port := range []string{"80", "443"} {
		l, err := w.ns.Listen("tcp", rulesIP.String()+":"+port)
		if err != nil {
			t.Fatal(err)
		}
		if port == "443" {
			l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		t.Cleanup(func() { l.Close() })
		go http.Serve(l, h)
	}
	return caPEM
}

// testServerCert makes a CA of its own (valid for an hour) and a server certificate
// for name signed by it; it returns the certificate with its key and the CA as PEM,
// which only egressd's Config.UpstreamCAPEM trusts.
func testServerCert(t *testing.T, name string) (tls.Certificate, []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// rulesWorld is a world for the HTTP-rule tests: sandboxes made with a Credential Vault
// (whose CA lifecycle installs), the rules server on rulesIP (writes counts the
// requests other than GET that reach it), the names of zone served by the upstream
// resolver, and intercept, egressd's config to intercept that server (the L7 proxy on
// 15001, the vault, the server's CA trusted upstream).
func rulesWorld(t *testing.T, zone map[string]netip.Addr) (w *world, writes *atomic.Int32, intercept func(*Config)) {
	t.Helper()
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w = newWorld(t, func(o *lctest.Options) { o.CredentialVault = store })
	writes = new(atomic.Int32)
	caPEM := w.rulesServer(t, writes)
	w.upstream = dnstest.Serve(t, dnstest.Zone(zone, 300))
	return w, writes, func(c *Config) { c.L7Port = 15001; c.Vault = store; c.UpstreamCAPEM = caPEM }
}

// TestEgressdHTTPRules runs a real sandbox, on each datapath, under a policy whose
// host has HTTP rules (read-only, and never DELETE under /repos/): over HTTPS
// (intercepted with the sandbox's CA, which lifecycle installed at create) and plain
// HTTP (checked per request), GET reaches the server, POST and DELETE get 403 with a
// JSON body naming the rule and never reach it, and every request is audited with its
// rule.
func TestEgressdHTTPRules(t *testing.T) {
	w, writes, intercept := rulesWorld(t, map[string]netip.Addr{"rules.test.": rulesIP, "allowed.test.": allowedIP})
	const policy = `{"defaultAction":"deny","egress":[
	  {"action":"allow","target":"rules.test","http":{
	    "rules":[{"action":"deny","methods":["DELETE"],"path":"/repos/*"}],
	    "access":"read-only"}},
	  {"action":"allow","target":"allowed.test"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		for _, scheme := range []string{"https", "http"} {
			url := scheme + "://rules.test/repos/o/r"
			if code, out := sh(t, x, "curl -sS -m 5 "+url); code != 0 || out != "GET /repos/o/r" {
				t.Errorf("GET %s = %d %q, want the server's answer", url, code, out)
			}
			for _, c := range []struct{ method, rule string }{
				{"POST", "egress[0].http.default"},
				{"DELETE", "egress[0].http.rules[0]"},
			} {
				code, out := sh(t, x, "curl -sS -m 5 -w '\\n%{http_code}' -X "+c.method+" "+url)
				i := strings.LastIndexByte(out, '\n')
				body, status := out[:max(i, 0)], out[i+1:]
				var denied httpDenied
				json.Unmarshal([]byte(body), &denied)
				if code != 0 || status != "403" || denied.Rule != c.rule || denied.Code != "EGRESS_DENIED" {
					t.Errorf("%s %s = %d %q, want 403 with a JSON body naming %s", c.method, url, code, out, c.rule)
				}
				w.waitAudit(t, sb.ID, c.method+" "+scheme+" denied", func(r audit.Record) bool {
					return r.Source == audit.SourceL7 && r.Action == "deny" && r.Rule == c.rule && r.Proto == scheme &&
						r.DstHost == "rules.test" && r.Extra["method"] == c.method
				})
			}
			w.waitAudit(t, sb.ID, "GET "+scheme+" allowed", func(r audit.Record) bool {
				return r.Source == audit.SourceL7 && r.Action == "allow" && r.Rule == "egress[0].http.access" &&
					r.Proto == scheme && r.Extra["method"] == "GET"
			})
		}
		// Through the explicit proxy: http:// requests are checked the same way; a
		// CONNECT tunnel would hide the requests, so it is refused for such a host.
		px := fmt.Sprintf("-x http://%s:3128 ", w.gw)
		if _, out := sh(t, x, "curl -sS -m 5 "+px+"http://rules.test/a"); out != "GET /a" {
			t.Errorf("GET through the explicit proxy = %q", out)
		}
		if _, out := sh(t, x, "curl -sS -m 5 -X DELETE "+px+"http://rules.test/repos/a"); !strings.Contains(out, `"rule":"egress[0].http.rules[0]"`) {
			t.Errorf("DELETE through the explicit proxy = %q, want 403 naming the rule", out)
		}
		if code, out := sh(t, x, "curl -sS -m 5 "+px+"https://rules.test/a"); code == 0 {
			t.Errorf("CONNECT to a host with HTTP rules through the explicit proxy passed: %q", out)
		}
		if n := writes.Load(); n != 0 {
			t.Errorf("the server saw %d requests other than GET", n)
		}
		// A host without HTTP rules keeps the SNI check and splice: its certificate is
		// the server's own, not one minted by the sandbox's CA.
		issuer := func(host string) string {
			py := `import ssl,socket
c=ssl.create_default_context();c.check_hostname=False;c.verify_mode=ssl.CERT_NONE
s=c.wrap_socket(socket.create_connection(('%s',443),timeout=5),server_hostname='%s')
print('airlock' if b'Airlock' in s.getpeercert(True) else 'server')`
			_, out := sh(t, x, "python3 -c \""+fmt.Sprintf(py, host, host)+"\"")
			return out
		}
		if got := issuer("allowed.test"); got != "server" {
			t.Errorf("allowed.test (no HTTP rules): certificate from %q, want the server's own (spliced)", got)
		}
		if got := issuer("rules.test"); got != "airlock" {
			t.Errorf("rules.test (HTTP rules): certificate from %q, want one minted by the sandbox's CA", got)
		}
	}, func(c *Config) { intercept(c); c.ProxyPort = 3128 })
}
