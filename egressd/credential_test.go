package egressd

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/policies"
)

type recordSink struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (s *recordSink) Append(r audit.Record) { s.mu.Lock(); s.recs = append(s.recs, r); s.mu.Unlock() }

const credSecret = "sk-credential-proxy-test-SECRET"

// echoHandler answers with the request's method, path and headers as JSON.
var echoHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "path": r.URL.Path, "headers": r.Header, "remote": r.RemoteAddr})
})

// credRig is a credential proxy in front of one upstream (TLS or not), with a real vault
// holding a bearer binding for example.com on GET /v1/*.
type credRig struct {
	cp     *credentialProxy
	store  *vault.Store
	sink   *recordSink
	dst    netip.AddrPort
	isTLS  bool
	caPool *x509.CertPool
	host   string       // the bound name
	hits   atomic.Int32 // requests the upstream saw
	closed sync.Map     // upstream-side remote address of each closed connection -> true
	// rules and policyOnly, when set, go into each connection's credTarget (HTTP rules).
	rules      *policies.HTTPHost
	policyOnly bool
}

func newCredRig(t *testing.T, isTLS bool) *credRig { return newCredRigFor(t, isTLS, "example.com") }

// newCredRigFor binds host instead; the TLS upstream's certificate names example.com.
func newCredRigFor(t *testing.T, isTLS bool, host string) *credRig {
	t.Helper()
	r := &credRig{host: host}
	h := http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) { r.hits.Add(1); echoHandler(w, q) })
	up := httptest.NewUnstartedServer(h)
	up.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			r.closed.Store(c.RemoteAddr().String(), true)
		}
	}
	if isTLS {
		up.StartTLS()
	} else {
		up.Start()
	}
	t.Cleanup(up.Close)
	port := netip.MustParseAddrPort(up.Listener.Addr().String()).Port() // the original destination's
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, caPEM, err := store.CA("sbx")
	if err != nil {
		t.Fatal(err)
	}
	scheme := map[bool]string{true: "https", false: "http"}[isTLS]
	body := fmt.Sprintf(`{"credentials":[{"name":"c","source":{"type":"inline","value":%q}}],
	  "bindings":[{"name":"b","match":{"hosts":[%q],"schemes":[%q],"ports":[%d],"methods":["GET"],"paths":["/v1/*"]},"auth":{"type":"bearer","credential":"c"}}]}`,
		credSecret, host, scheme, port)
	rec := httptest.NewRecorder()
	store.ServeAPI(rec, httptest.NewRequest("POST", "/credential-vault", strings.NewReader(body)), "sbx", "/credential-vault",
		func(string, uint16) error { return nil })
	if rec.Code != 201 {
		t.Fatalf("vault create: %d %s", rec.Code, rec.Body)
	}
	var upstreamPEM []byte
	if isTLS {
		upstreamPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw})
	}
	sink := &recordSink{}
	d := &Daemon{cfg: Config{Vault: store, Audit: sink, UpstreamCAPEM: upstreamPEM}, log: slog.New(slog.DiscardHandler)}
	cp, err := newCredentialProxy(d)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	r.cp, r.store, r.sink, r.dst, r.isTLS, r.caPool = cp, store, sink, netip.MustParseAddrPort(up.Listener.Addr().String()), isTLS, pool
	return r
}

// do sends one request from "the sandbox" through an intercepted connection and
// returns the status and what the upstream saw.
func (r *credRig) do(t *testing.T, method, path, host string, hdr http.Header) (int, map[string]any, *tls.ConnectionState) {
	t.Helper()
	client, server := net.Pipe()
	go r.cp.serve(server, nil, credTarget{sandbox: "sbx", host: r.host, dst: r.dst, src: "10.0.0.2:4000",
		http: r.rules, policyOnly: r.policyOnly}, r.isTLS)
	defer client.Close()
	var conn net.Conn = client
	var state *tls.ConnectionState
	if r.isTLS {
		tc := tls.Client(client, &tls.Config{ServerName: r.host, RootCAs: r.caPool})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS with the sandbox's CA: %v", err)
		}
		st := tc.ConnectionState()
		state, conn = &st, tc
	}
	req, _ := http.NewRequest(method, "http://"+host+path, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen map[string]any
	json.NewDecoder(resp.Body).Decode(&seen)
	return resp.StatusCode, seen, state
}

func authOf(seen map[string]any) string {
	h, _ := seen["headers"].(map[string]any)
	v, _ := h["Authorization"].([]any)
	if len(v) == 0 {
		return ""
	}
	return fmt.Sprint(v[0])
}

func TestCredentialProxyInjects(t *testing.T) {
	for _, isTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "https", false: "http"}[isTLS], func(t *testing.T) {
			r := newCredRig(t, isTLS)
			code, seen, st := r.do(t, "GET", "/v1/repos", "example.com", nil)
			if code != 200 || authOf(seen) != "Bearer "+credSecret {
				t.Fatalf("bound request: %d, upstream saw %v", code, seen)
			}
			if isTLS && !strings.Contains(st.PeerCertificates[0].Issuer.CommonName, "Airlock credential proxy CA sbx") {
				t.Errorf("leaf issued by %q", st.PeerCertificates[0].Issuer.CommonName)
			}
			if _, seen, _ := r.do(t, "GET", "/v1/x", "example.com", http.Header{"Authorization": {"Bearer guess"}}); authOf(seen) != "Bearer "+credSecret {
				t.Errorf("the sandbox's own Authorization was not replaced: %v", seen)
			}
			if _, seen, _ := r.do(t, "POST", "/v1/x", "example.com", http.Header{"Authorization": {"Bearer mine"}}); authOf(seen) != "Bearer mine" {
				t.Errorf("unbound method changed: %v", seen)
			}
			if _, seen, _ := r.do(t, "GET", "/other", "example.com", nil); authOf(seen) != "" {
				t.Errorf("unbound path got a credential: %v", seen)
			}
			if code, _, _ := r.do(t, "GET", "/v1/x", "evil.example", nil); code != http.StatusForbidden {
				t.Errorf("another Host inside the connection: %d, want 403", code)
			}
			r.sink.mu.Lock()
			defer r.sink.mu.Unlock()
			var allow, deny int
			for _, rec := range r.sink.recs {
				if rec.Source != audit.SourceCredential {
					t.Errorf("record source %q", rec.Source)
				}
				if strings.Contains(fmt.Sprintf("%+v", rec), credSecret) {
					t.Errorf("an audit record holds the secret: %+v", rec)
				}
				switch rec.Action {
				case "allow":
					allow++
					if rec.Rule != "b" || rec.DstHost != "example.com" || rec.Extra["method"] != "GET" {
						t.Errorf("injection record: %+v", rec)
					}
				case "deny":
					deny++
				}
			}
			if allow != 2 || deny != 3 {
				t.Errorf("audit: %d injections, %d refusals; want 2 and 3", allow, deny)
			}
		})
	}
}

// TestCredentialProxyVerifiesUpstream: an upstream whose certificate the proxy does not
// trust gets the sandbox a 502, and no credential leaves.
func TestCredentialProxyVerifiesUpstream(t *testing.T) {
	r := newCredRig(t, true)
	d := &Daemon{cfg: Config{Vault: r.store, Audit: r.sink}, log: slog.New(slog.DiscardHandler)} // no UpstreamCAPEM
	cp, err := newCredentialProxy(d)
	if err != nil {
		t.Fatal(err)
	}
	r.cp = cp
	if code, _, _ := r.do(t, "GET", "/v1/repos", "example.com", nil); code != http.StatusBadGateway && code != http.StatusInternalServerError {
		t.Errorf("untrusted upstream: %d, want a 5xx", code)
	}
}

// TestCredentialProxyPathScoping: a binding for GET /v1/* injects only into requests
// whose path every server resolves under /v1/, with exactly the bound method, and the
// injected request cannot ask the upstream for another method.
func TestCredentialProxyPathScoping(t *testing.T) {
	for _, isTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "https", false: "http"}[isTLS], func(t *testing.T) {
			r := newCredRig(t, isTLS)
			for _, tc := range []struct{ method, path string }{
				{"GET", "/v1/../user/keys"},
				{"GET", "/v1/%2e%2e/user/keys"},
				{"GET", "/v1/%2E%2E/user/keys"},
				{"GET", "/v1/..%2fuser/keys"},
				{"GET", "/v1/..%5cuser/keys"},
				{"GET", "/v1/%252e%252e/user/keys"},
				{"GET", "/v1//x"},
				{"get", "/v1/x"},
			} {
				code, seen, _ := r.do(t, tc.method, tc.path, "example.com", nil)
				if code != 200 {
					t.Errorf("%s %s: status %d, want the request forwarded", tc.method, tc.path, code)
				}
				if authOf(seen) != "" {
					t.Errorf("%s %s: the upstream got the credential (it saw path %v)", tc.method, tc.path, seen["path"])
				}
			}
			_, seen, _ := r.do(t, "GET", "/v1/x", "example.com", http.Header{"X-Http-Method-Override": {"DELETE"}, "X-Method-Override": {"DELETE"}})
			h, _ := seen["headers"].(map[string]any)
			if authOf(seen) != "Bearer "+credSecret || h["X-Http-Method-Override"] != nil || h["X-Method-Override"] != nil {
				t.Errorf("injected request: upstream saw %v", seen)
			}
			r.sink.mu.Lock()
			defer r.sink.mu.Unlock()
			var notCanonical int
			for _, rec := range r.sink.recs {
				if rec.Action == "deny" && strings.Contains(rec.Reason, "not canonical") {
					notCanonical++
				}
			}
			if notCanonical != 7 {
				t.Errorf("%d refusals name a non-canonical path, want 7", notCanonical)
			}
		})
	}
}

// TestCredentialProxyWrongName: an upstream whose certificate is trusted but names
// another host than the binding's (the sandbox chose its address) gets no request, so
// never the secret; the sandbox gets a 5xx.
func TestCredentialProxyWrongName(t *testing.T) {
	r := newCredRigFor(t, true, "api.test") // httptest's certificate names example.com
	if code, _, _ := r.do(t, "GET", "/v1/repos", "api.test", nil); code < 500 {
		t.Errorf("upstream without a certificate for api.test: %d, want a 5xx", code)
	}
	if n := r.hits.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}
