package gateway

import (
	"net/http"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestExecdTokenAtGateway: with the execd key, the sandbox's execd token alone (as
// OpenSandbox's execd clients send it) admits a request to port 44772 of that sandbox,
// and only there; whatever admitted it, execd receives the sandbox's own token (a
// client's other value is replaced); other ports never see the header.
func TestExecdTokenAtGateway(t *testing.T) {
	key := execdtoken.NewKey()
	up := loopbackControl(t)
	e := newEnv(t, func(c *Config) { withAPIKey(c); c.ExecdKey = key })
	sb := runningSandbox("ctl", up.addr)
	sb.Access = watch.Access{Mode: watch.Public, TokenSHA256: accesstoken.Sum(testAccessToken).String()}
	e.put(sb)
	tok := key.Derive("ctl")
	execd := "/sandboxes/ctl/proxy/" + itoa(opensandbox.ExecdPort) + "/x"
	for _, c := range []struct {
		access string
		hdr    http.Header
	}{
		{"execd_token", http.Header{opensandbox.HeaderExecdAccessToken: {tok}}},
		{"token", http.Header{opensandbox.HeaderAccessToken: {testAccessToken}}},
		{"token", http.Header{opensandbox.HeaderSecureAccess: {testAccessToken}, opensandbox.HeaderExecdAccessToken: {"stale"}}},
		{"api_key", http.Header{opensandbox.HeaderAPIKey: {testAPIKey}}},
	} {
		resp := e.do("GET", "", execd, c.hdr)
		rid := resp.Header.Get("X-Request-Id")
		echo := decodeEcho(t, resp)
		if got := echo.Headers.Values(opensandbox.HeaderExecdAccessToken); len(got) != 1 || got[0] != tok {
			t.Errorf("%v: execd received X-EXECD-ACCESS-TOKEN %q, want the sandbox's", c.hdr, got)
		}
		wantNoCredentials(t, echo)
		if rec, _ := e.audit.byRequestID(rid); rec.Source != audit.SourceGateway || rec.Action != "allow" || rec.Reason != c.access {
			t.Errorf("%v: audit record %+v, want admitted by %s", c.hdr, rec, c.access)
		}
	}
	for _, bad := range []string{"", "wrong", key.Derive("other")} {
		wantError(t, e.do("GET", "", execd, http.Header{opensandbox.HeaderExecdAccessToken: {bad}}), http.StatusUnauthorized, "UNAUTHORIZED")
	}
	// The execd token opens no other port, and no other port receives it.
	wantError(t, e.do("GET", "", "/sandboxes/ctl/proxy/"+itoa(opensandbox.EgressAPIPort)+"/x",
		http.Header{opensandbox.HeaderExecdAccessToken: {tok}}), http.StatusUnauthorized, "UNAUTHORIZED")
	echo := decodeEcho(t, e.do("GET", "", "/sandboxes/ctl/proxy/"+itoa(appPort)+"/x", http.Header{opensandbox.HeaderExecdAccessToken: {tok}}))
	if v := echo.Headers.Values(opensandbox.HeaderExecdAccessToken); len(v) != 0 {
		t.Errorf("the application port received X-EXECD-ACCESS-TOKEN %q", v)
	}
}
