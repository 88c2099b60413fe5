package egressd

import (
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

// TestCredentialDecide is the L7 proxy's verdict for credentialProxy sandboxes: HTTPS to
// a bound host goes to any address the policy accepts for the name (the certificate
// proves it), plain HTTP carries the credential to a learned address only unless
// vault.plainHTTP is policy, and everything no binding matches follows the policy.
func TestCredentialDecide(t *testing.T) {
	const (
		denyDoc  = `{"defaultAction":"deny","egress":[{"action":"allow","target":"api.test"},{"action":"allow","target":"other.test"}]}`
		allowDoc = `{"defaultAction":"allow","egress":[{"action":"allow","target":"api.test"}]}`
		sniDoc   = `{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":"api.test"},{"action":"allow","target":"other.test"}]}`
	)
	learned := netip.MustParseAddr("203.0.113.10") // from a DNS answer for api.test
	otherIP := netip.MustParseAddr("203.0.113.20") // learned for other.test only
	chosen := netip.MustParseAddr("203.0.113.99")  // nobody's answer: curl --resolve, /etc/hosts
	private := netip.MustParseAddr("10.255.255.1") // special: only an explicit rule allows it
	type want struct{ allowed, intercept, inject bool }
	cases := []struct {
		name      string
		doc       string
		plain     PlainHTTPMode
		host      string
		tls       bool
		dst       netip.Addr
		noCredBox bool // a sandbox without credentialProxy
		unhandled bool // left to the `l7: sni` check
		want      want
	}{
		{name: "https bound learned", doc: denyDoc, host: "api.test", tls: true, dst: learned, want: want{true, true, true}},
		{name: "https bound chosen", doc: denyDoc, host: "api.test", tls: true, dst: chosen, want: want{true, true, true}},
		{name: "https bound chosen sni", doc: sniDoc, host: "api.test", tls: true, dst: chosen, want: want{true, true, true}},
		{name: "https bound private", doc: denyDoc, host: "api.test", tls: true, dst: private},
		{name: "http bound learned", doc: denyDoc, host: "api.test", dst: learned, want: want{true, true, true}},
		{name: "http bound chosen deny default", doc: denyDoc, host: "api.test", dst: chosen},
		{name: "http bound chosen allow default", doc: allowDoc, host: "api.test", dst: chosen, want: want{true, true, false}},
		{name: "http bound chosen sni", doc: sniDoc, host: "api.test", dst: chosen},
		{name: "http bound chosen opt-in", doc: denyDoc, plain: PlainHTTPPolicy, host: "api.test", dst: chosen, want: want{true, true, true}},
		{name: "http bound private opt-in", doc: allowDoc, plain: PlainHTTPPolicy, host: "api.test", dst: private},
		{name: "http bound other's address", doc: denyDoc, host: "api.test", dst: otherIP, want: want{true, true, false}},
		{name: "unbound chosen allow default", doc: allowDoc, host: "unbound.test", dst: chosen, want: want{allowed: true}},
		{name: "unbound https chosen allow default", doc: allowDoc, host: "unbound.test", tls: true, dst: chosen, want: want{allowed: true}},
		{name: "no SNI allow default", doc: allowDoc, tls: true, dst: chosen, want: want{allowed: true}},
		{name: "unbound chosen deny default", doc: denyDoc, host: "unbound.test", dst: chosen},
		{name: "unbound learned address", doc: denyDoc, host: "unbound.test", dst: otherIP, want: want{allowed: true}},
		{name: "unbound sni", doc: sniDoc, host: "other.test", dst: otherIP, unhandled: true},
		{name: "no credentialProxy", doc: allowDoc, host: "api.test", tls: true, dst: chosen, noCredBox: true, unhandled: true},
	}
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := store.CA("sbx"); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	store.ServeAPI(rec, httptest.NewRequest("POST", "/credential-vault", strings.NewReader(`{
	  "credentials":[{"name":"c","source":{"type":"inline","value":"v"}}],
	  "bindings":[{"name":"s","match":{"hosts":["api.test"]},"auth":{"type":"bearer","credential":"c"}},
	              {"name":"p","match":{"hosts":["api.test"],"schemes":["http"],"ports":[80]},"auth":{"type":"bearer","credential":"c"}}]}`)),
		"sbx", "/credential-vault", func(string, uint16) error { return nil })
	if rec.Code != 201 {
		t.Fatalf("vault: %d %s", rec.Code, rec.Body)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dec, err := policies.Load("test", []byte(c.doc), policies.CompileOptions{Overlay: policies.BaseOverlay()})
			if err != nil {
				t.Fatal(err)
			}
			until := time.Now().Add(time.Minute)
			sb := &sandbox{view: watch.Sandbox{ID: "sbx", CredentialProxy: !c.noCredBox}, learned: map[netip.Addr]learnedAddr{
				learned: {names: []string{"api.test"}, until: until, every: true},
				otherIP: {names: []string{"other.test"}, until: until, every: true},
			}}
			d := &Daemon{cfg: Config{Vault: store, VaultPlainHTTP: c.plain}, log: slog.New(slog.DiscardHandler),
				byID: map[string]*sandbox{"sbx": sb}}
			cp, err := newCredentialProxy(d)
			if err != nil {
				t.Fatal(err)
			}
			d.cred = cp
			port := uint16(80)
			if c.tls {
				port = 443
			}
			var r audit.Record
			target, allowed, handled := cp.decide(dnsfilter.Sandbox{ID: "sbx", Policy: dec}, c.host, c.tls, nil,
				netip.MustParseAddrPort("10.0.0.2:40000"), netip.AddrPortFrom(c.dst, port), &r)
			if handled == c.unhandled {
				t.Fatalf("handled %v, want %v", handled, !c.unhandled)
			}
			if c.unhandled {
				return
			}
			got := want{allowed: allowed, intercept: target != nil, inject: target != nil && target.noInject == ""}
			if got != c.want {
				t.Errorf("got %+v (reason %q), want %+v", got, r.Reason, c.want)
			}
			if got.intercept && !got.inject && !strings.Contains(target.noInject, "not injected: address not learned") {
				t.Errorf("not-injected reason %q", target.noInject)
			}
			if r.Reason == "" {
				t.Error("no audit reason")
			}
		})
	}
}
