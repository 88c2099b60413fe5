package gateway

import (
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/internal/testupstream"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

const (
	testAPIKey      = "gateway-test-api-key-0123456789"
	testAccessToken = "tok-0123456789abcdef"
	appPort         = 8080
)

// withAPIKey gives the gateway the SHA-256 of testAPIKey.
func withAPIKey(c *Config) { c.APIKeySHA256 = accesstoken.Sum(testAPIKey).String() }

// loopbackControl serves the test application on one random 127/8 address at the
// application port (8080) and the control ports (44772, 18080), whose numbers are fixed.
func loopbackControl(t *testing.T) upstream {
	t.Helper()
	for range 10 {
		var b [3]byte
		_, _ = rand.Read(b[:])
		addr := netip.AddrFrom4([4]byte{127, 1 + b[0]%250, b[1], 1 + b[2]%250})
		var lns []net.Listener
		for _, port := range []int{appPort, opensandbox.ExecdPort, opensandbox.EgressAPIPort} {
			ln, err := net.Listen("tcp", net.JoinHostPort(addr.String(), itoa(port)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) < 3 {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		h := testupstream.Handler()
		for _, ln := range lns {
			srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
			srv.Start()
			t.Cleanup(srv.Close)
		}
		return upstream{addr, appPort}
	}
	t.Fatal("no free 127/8 address for ports 8080, 44772 and 18080")
	return upstream{}
}

// forEachControlUpstream runs f against the application answering on 8080, 44772 and
// 18080 of one address: on loopback and inside a real sandbox container.
func forEachControlUpstream(t *testing.T, f func(t *testing.T, up upstream)) {
	t.Run("loopback", func(t *testing.T) { f(t, loopbackControl(t)) })
	t.Run("sandbox", func(t *testing.T) { f(t, sharedSandbox(t)) })
}

// merged returns a copy of a with b's entries added.
func merged(a, b http.Header) http.Header {
	out := a.Clone()
	if out == nil {
		out = http.Header{}
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// wantNoCredentials fails when a credential reached the sandbox.
func wantNoCredentials(t *testing.T, echo testupstream.Echo) {
	t.Helper()
	for _, h := range []string{opensandbox.HeaderAccessToken, opensandbox.HeaderSecureAccess, opensandbox.HeaderAPIKey} {
		if _, ok := echo.Headers[h]; ok {
			t.Fatalf("credential header %s reached the sandbox", h)
		}
	}
}

// wantIngressDenial checks the audit record of a refused credential: source ingress, the
// sandbox and port, and neither the token nor the API key anywhere in it.
func (e *env) wantIngressDenial(t *testing.T, eb opensandbox.ErrorBody, id string, port int) {
	t.Helper()
	rec, ok := e.audit.byRequestID(eb.RequestID)
	if !ok || rec.Source != audit.SourceIngress || rec.Action != "deny" || rec.SandboxID != id || rec.DstPort != port ||
		rec.Extra[auditStatus] != float64(http.StatusUnauthorized) || rec.Rule != "access:token" {
		t.Fatalf("audit record of the denial: %+v", rec)
	}
	b, _ := json.Marshal(rec)
	if strings.Contains(string(b), testAccessToken) || strings.Contains(string(b), testAPIKey) {
		t.Fatalf("audit record carries a credential: %s", b)
	}
}

// TestControlPortsNeedCredential: execd (44772) and the egress API (18080) answer 401
// without a credential through every routing form, even when the watch says the sandbox
// is public; the access token (both headers), the API key and a signed URL pass, and no
// credential reaches the sandbox.
func TestControlPortsNeedCredential(t *testing.T) {
	forEachControlUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, withAPIKey)
		sb := runningSandbox("ctl", up.addr)
		sb.Access = watch.Access{Mode: watch.Public, TokenSHA256: accesstoken.Sum(testAccessToken).String()}
		e.put(sb)
		for _, port := range []int{opensandbox.ExecdPort, opensandbox.EgressAPIPort} {
			p := itoa(port)
			forms := []struct {
				name, host, path string
				hdr              http.Header
			}{
				{"header_ingress_to", "", "/x", http.Header{"Opensandbox-Ingress-To": {"ctl-" + p}}},
				{"header_airlock", "", "/x", http.Header{"X-Airlock-Sandbox": {"ctl"}, "X-Airlock-Port": {p}}},
				{"host_port_first", e.hostOf(p + "-ctl"), "/x", nil},
				{"host_id_first", e.hostOf("ctl-" + p), "/x", nil},
				{"path_proxy", "", "/sandboxes/ctl/proxy/" + p + "/x", nil},
				{"path_short", "", "/ctl/" + p + "/x", nil},
			}
			for _, f := range forms {
				t.Run(p+"/"+f.name, func(t *testing.T) {
					for _, bad := range []http.Header{
						nil,
						{opensandbox.HeaderAccessToken: {"wrong"}},
						{opensandbox.HeaderSecureAccess: {""}},
						{opensandbox.HeaderAPIKey: {"wrong"}},
						{opensandbox.HeaderAPIKey: {testAPIKey + "x"}, opensandbox.HeaderSecureAccess: {testAccessToken + "x"}},
					} {
						eb := wantError(t, e.do("GET", f.host, f.path, merged(f.hdr, bad)), http.StatusUnauthorized, "UNAUTHORIZED")
						e.wantIngressDenial(t, eb, "ctl", port)
					}
					for _, good := range []struct {
						access string // how the gateway admits it (the audit record's reason)
						hdr    http.Header
					}{
						{"token", http.Header{opensandbox.HeaderAccessToken: {testAccessToken}}},
						{"token", http.Header{opensandbox.HeaderSecureAccess: {testAccessToken}}},
						{"api_key", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}}},
						// The OpenSandbox SDK sends its API key and the endpoint's token header.
						{"api_key", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}, opensandbox.HeaderSecureAccess: {testAccessToken}}},
						{"token", http.Header{opensandbox.HeaderAPIKey: {"stale"}, opensandbox.HeaderSecureAccess: {testAccessToken}}},
					} {
						resp := e.do("GET", f.host, f.path, merged(f.hdr, good.hdr))
						rid := resp.Header.Get("X-Request-Id")
						echo := decodeEcho(t, resp)
						if echo.Path != "/x" {
							t.Fatalf("%v: upstream path %q, want /x", good.hdr, echo.Path)
						}
						wantNoCredentials(t, echo)
						if rec, _ := e.audit.byRequestID(rid); rec.Source != audit.SourceGateway || rec.Action != "allow" || rec.Reason != good.access {
							t.Fatalf("%v: audit record %+v", good.hdr, rec)
						}
					}
				})
			}
			t.Run(p+"/signed", func(t *testing.T) {
				now := time.Now()
				signed, _ := e.keys.Mint("ctl", port, now.Add(time.Hour))
				label, _ := signed.Label()
				for name, req := range map[string]struct {
					host, path string
					hdr        http.Header
				}{
					"host":   {e.hostOf(label), "/x", nil},
					"header": {"", "/x", http.Header{"Opensandbox-Ingress-To": {label}}},
					"path":   {"", signed.Path() + "/x", nil},
				} {
					echo := decodeEcho(t, e.do("GET", req.host, req.path, req.hdr))
					if echo.Path != "/x" {
						t.Fatalf("%s: upstream path %q", name, echo.Path)
					}
				}
				// A signature for the application port does not open a control port.
				app, _ := e.keys.Mint("ctl", appPort, now.Add(time.Hour))
				appLabel, _ := app.Label()
				forged := p + strings.TrimPrefix(appLabel, itoa(appPort))
				eb := wantError(t, e.do("GET", e.hostOf(forged), "/x", nil), http.StatusUnauthorized, "UNAUTHORIZED")
				e.wantIngressDenial(t, eb, "ctl", port)
				expired, _ := e.keys.Mint("ctl", port, now.Add(-time.Minute))
				wantError(t, e.do("GET", "", expired.Path()+"/x", nil), http.StatusUnauthorized, "UNAUTHORIZED")
			})
		}
		if n := metricValue(t, e.reg, "airlock_gateway_requests_total", map[string]string{"form": "path", "result": "unauthorized"}); n < 10 {
			t.Errorf("path/unauthorized requests = %v, want at least 10", n)
		}
	})
}

// TestUserPortAccess: an application port is public by default (credential headers a
// client sends are still stripped); under token mode (lifecycle's defaultAccess token or
// secureAccess) it needs a credential like the control ports.
func TestUserPortAccess(t *testing.T) {
	forEachControlUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, withAPIKey)
		digest := accesstoken.Sum(testAccessToken).String()
		control := map[int]watch.AccessMode{opensandbox.ExecdPort: watch.Token, opensandbox.EgressAPIPort: watch.Token}
		pub := runningSandbox("pubapp", up.addr)
		pub.Access = watch.Access{Mode: watch.Public, Ports: control, TokenSHA256: digest}
		e.put(pub)
		tok := runningSandbox("tokapp", up.addr)
		tok.Access = watch.Access{Mode: watch.Token, Ports: control, TokenSHA256: digest}
		e.put(tok)
		p := itoa(up.port)

		echo := decodeEcho(t, e.do("GET", e.hostOf(p+"-pubapp"), "/pub", nil))
		if echo.Path != "/pub" {
			t.Fatalf("public port: path %q", echo.Path)
		}
		wantNoCredentials(t, decodeEcho(t, e.do("GET", e.hostOf(p+"-pubapp"), "/pub",
			http.Header{opensandbox.HeaderAPIKey: {testAPIKey}, opensandbox.HeaderSecureAccess: {"anything"}})))
		wantError(t, e.do("GET", e.hostOf(itoa(opensandbox.ExecdPort)+"-pubapp"), "/ping", nil), http.StatusUnauthorized, "UNAUTHORIZED")

		for _, form := range []struct {
			host, path string
			hdr        http.Header
		}{
			{e.hostOf(p + "-tokapp"), "/t", nil},
			{"", "/sandboxes/tokapp/proxy/" + p + "/t", nil},
			{"", "/t", http.Header{"Opensandbox-Ingress-To": {"tokapp-" + p}}},
		} {
			eb := wantError(t, e.do("GET", form.host, form.path, form.hdr), http.StatusUnauthorized, "UNAUTHORIZED")
			e.wantIngressDenial(t, eb, "tokapp", up.port)
			for _, good := range []http.Header{{opensandbox.HeaderSecureAccess: {testAccessToken}}, {opensandbox.HeaderAPIKey: {testAPIKey}}} {
				echo := decodeEcho(t, e.do("GET", form.host, form.path, merged(form.hdr, good)))
				if echo.Path != "/t" {
					t.Fatalf("token port: path %q", echo.Path)
				}
				wantNoCredentials(t, echo)
			}
		}
	})
}

// TestAPIKeyUnknownToGateway: a gateway that was not given the API key's digest admits
// no request on the strength of an API key.
func TestAPIKeyUnknownToGateway(t *testing.T) {
	e := newEnv(t, nil)
	up := loopbackControl(t)
	sb := runningSandbox("nokey", up.addr)
	sb.Access.TokenSHA256 = accesstoken.Sum(testAccessToken).String()
	e.put(sb)
	eb := wantError(t, e.do("GET", e.hostOf("44772-nokey"), "/", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}}), http.StatusUnauthorized, "UNAUTHORIZED")
	if !strings.Contains(eb.Message, "API key") {
		t.Errorf("message %q does not say the API key was refused", eb.Message)
	}
	decodeEcho(t, e.do("GET", e.hostOf("44772-nokey"), "/", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}, opensandbox.HeaderAccessToken: {testAccessToken}}))
}

// TestEgressAPIForwardCredentials: port 18080 goes to lifecycle (App.EgressAPI) only once
// admitted; lifecycle receives the gateway's own credential, never the client's token or
// API key.
func TestEgressAPIForwardCredentials(t *testing.T) {
	lc := httptest.NewServer(testupstream.Handler()) // stands in for lifecycle: echoes the request
	t.Cleanup(lc.Close)
	e := newEnv(t, func(c *Config) {
		withAPIKey(c)
		c.EgressAPIDial = strings.TrimPrefix(lc.URL, "http://")
		c.EgressAPIHeader = http.Header{opensandbox.HeaderAPIKey: {"gateway-forward-key"}}
	})
	sb := runningSandbox("eg", netip.MustParseAddr("127.0.0.1"))
	sb.Access.TokenSHA256 = accesstoken.Sum(testAccessToken).String()
	e.put(sb)
	eb := wantError(t, e.do("GET", "", "/sandboxes/eg/proxy/18080/policy", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	e.wantIngressDenial(t, eb, "eg", opensandbox.EgressAPIPort)
	for _, cred := range []http.Header{{opensandbox.HeaderSecureAccess: {testAccessToken}}, {opensandbox.HeaderAPIKey: {testAPIKey}}} {
		echo := decodeEcho(t, e.do("GET", "", "/sandboxes/eg/proxy/18080/policy", cred))
		if echo.Path != "/sandboxes/eg/proxy/18080/policy" {
			t.Fatalf("lifecycle saw path %q", echo.Path)
		}
		if got := echo.Headers.Values(opensandbox.HeaderAPIKey); len(got) != 1 || got[0] != "gateway-forward-key" {
			t.Fatalf("lifecycle saw OPEN-SANDBOX-API-KEY %q, want only the gateway's", got)
		}
		if echo.Headers.Get(opensandbox.HeaderSecureAccess) != "" || echo.Headers.Get(opensandbox.HeaderAccessToken) != "" {
			t.Fatal("the client's access token was forwarded")
		}
	}
}
