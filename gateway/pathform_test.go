package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/pathform"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// TestPathFormHardening checks, against a real application through the gateway, that the
// path forms (one browser origin for every sandbox) refuse service worker scripts, drop
// Service-Worker-Allowed, scope cookies to the route's prefix and sandbox documents with a
// CSP, while host and header forms (an origin per sandbox port) pass all of it unchanged.
func TestPathFormHardening(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		p := itoa(up.port)
		e.put(runningSandbox("box-1", up.addr))
		sum := sha256.Sum256([]byte("tok-1"))
		sec := runningSandbox("sec", up.addr)
		sec.Access = watch.Access{Mode: watch.Signed, TokenSHA256: hex.EncodeToString(sum[:])}
		e.put(sec)
		signed, err := e.keys.Mint("sec", up.port, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}

		q := url.Values{"h": {
			"Content-Type: text/html; charset=utf-8",
			"Service-Worker-Allowed: /",
			"Set-Cookie: root=1; Path=/; Domain=airlock.localhost; HttpOnly",
			"Set-Cookie: api=2; Path=/api",
			"Set-Cookie: bare=3",
			"Content-Security-Policy: default-src 'self'",
		}}.Encode()
		html := "/respond?" + q
		json := "/respond?" + url.Values{"h": {"Content-Type: application/json"}}.Encode()
		sniffed := "/respond"

		paths := []struct{ name, prefix string }{
			{"path_proxy", "/sandboxes/box-1/proxy/" + p},
			{"path", "/box-1/" + p},
			{"path_signed", signed.Path()},
		}
		for _, f := range paths {
			t.Run(f.name, func(t *testing.T) {
				resp := e.do("GET", "", f.prefix+html, nil)
				readAll(t, resp)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if v, ok := resp.Header["Service-Worker-Allowed"]; ok {
					t.Errorf("Service-Worker-Allowed %q passed through", v)
				}
				wantCookies := []string{
					"root=1; HttpOnly; Path=" + f.prefix + "/",
					"api=2; Path=" + f.prefix + "/api",
					"bare=3; Path=" + f.prefix + "/",
				}
				if got := resp.Header.Values("Set-Cookie"); !slices.Equal(got, wantCookies) {
					t.Errorf("Set-Cookie %q, want %q", got, wantCookies)
				}
				if got := resp.Header.Values("Content-Security-Policy"); !slices.Equal(got, []string{"default-src 'self'", pathform.CSP}) {
					t.Errorf("Content-Security-Policy %q: want the app's and the gateway's sandbox", got)
				}

				resp = e.do("GET", "", f.prefix+sniffed, nil)
				readAll(t, resp)
				if got := resp.Header.Get("Content-Security-Policy"); got != pathform.CSP {
					t.Errorf("untyped response: Content-Security-Policy %q, want %q", got, pathform.CSP)
				}
				resp = e.do("GET", "", f.prefix+json, nil)
				readAll(t, resp)
				if got := resp.Header.Values("Content-Security-Policy"); len(got) != 0 {
					t.Errorf("JSON response: Content-Security-Policy %q, want none", got)
				}

				body := wantError(t, e.do("GET", "", f.prefix+"/sw.js", http.Header{"Service-Worker": {"script"}}), http.StatusForbidden, "FORBIDDEN")
				if rec, ok := e.audit.byRequestID(body.RequestID); !ok || rec.Action != "deny" {
					t.Errorf("service worker refusal not audited as deny: %+v", rec)
				}
			})
		}

		signedLabel, err := signed.Label()
		if err != nil {
			t.Fatal(err)
		}
		others := []struct {
			name, host string
			hdr        http.Header
		}{
			{"host", e.hostOf(p + "-box-1"), nil},
			{"host_signed", e.hostOf(signedLabel), nil},
			{"header", "", http.Header{"Opensandbox-Ingress-To": {"box-1-" + p}}},
		}
		for _, f := range others {
			t.Run(f.name, func(t *testing.T) {
				resp := e.do("GET", f.host, html, f.hdr)
				readAll(t, resp)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if got := resp.Header.Get("Service-Worker-Allowed"); got != "/" {
					t.Errorf("Service-Worker-Allowed %q, want the app's /", got)
				}
				if got := resp.Header.Values("Set-Cookie"); len(got) != 3 || got[0] != "root=1; Path=/; Domain=airlock.localhost; HttpOnly" {
					t.Errorf("Set-Cookie %q, want the app's", got)
				}
				if got := resp.Header.Values("Content-Security-Policy"); !slices.Equal(got, []string{"default-src 'self'"}) {
					t.Errorf("Content-Security-Policy %q, want only the app's", got)
				}
				hdr := http.Header{"Service-Worker": {"script"}}
				for k, v := range f.hdr {
					hdr[k] = v
				}
				resp = e.do("GET", f.host, "/sw.js", hdr)
				readAll(t, resp)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("service worker script on an origin of its own: status %d, want 200", resp.StatusCode)
				}
			})
		}
		if n := metricValue(t, e.reg, "airlock_gateway_requests_total", map[string]string{"form": "path_proxy", "result": "forbidden"}); n != 1 {
			t.Errorf("path_proxy/forbidden requests = %v, want 1", n)
		}
	})
}
