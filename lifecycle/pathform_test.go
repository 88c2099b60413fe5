package lifecycle_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/pathform"
	"github.com/airlockdev/airlock/opensandbox"
)

// cookieApp answers every GET with an HTML page that sets a root-path cookie, a cookie
// for a parent domain and Service-Worker-Allowed: /, what a sandbox would send to take
// over a shared origin.
const cookieApp = `
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        b = b"<html><script>navigator.serviceWorker.register('/sw.js', {scope: '/'})</script></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Set-Cookie", "session=stolen; Path=/")
        self.send_header("Set-Cookie", "wide=1; Domain=localhost; Path=/console/")
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// TestServerProxyPathFormHardening: lifecycle's server proxy is a path form on the API
// origin, which the console shares: a sandbox's responses through it cannot plant cookies
// outside its prefix, widen a service worker's scope or run as that origin, and service
// worker script fetches are refused with 403 (audited).
func TestServerProxyPathFormHardening(t *testing.T) {
	rec := &memAudit{}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: rec})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["entrypoint"] = []string{"python3", "-c", cookieApp}
	sb := c.create(req)
	c.waitState(sb.ID, opensandbox.Running)
	prefix := "/sandboxes/" + sb.ID + "/proxy/8000"

	var resp *http.Response
	for i := 0; ; i++ {
		resp, _ = c.do("GET", prefix+"/page", nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if i == 300 {
			t.Fatalf("the app never answered: %d", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond) // the app starts after execd
	}
	if v := resp.Header.Values("Service-Worker-Allowed"); len(v) != 0 {
		t.Errorf("Service-Worker-Allowed passed through: %q", v)
	}
	wantCookies := []string{"session=stolen; Path=" + prefix + "/", "wide=1; Path=" + prefix + "/console/"}
	if got := resp.Header.Values("Set-Cookie"); !slices.Equal(got, wantCookies) {
		t.Errorf("Set-Cookie %q, want %q", got, wantCookies)
	}
	if got := resp.Header.Get("Content-Security-Policy"); got != pathform.CSP {
		t.Errorf("Content-Security-Policy %q, want %q", got, pathform.CSP)
	}

	if st := c.status("GET", prefix+"/sw.js", "Service-Worker", "script"); st != http.StatusForbidden {
		t.Errorf("service worker script fetch: %d, want 403", st)
	}
	refused := false
	for _, r := range rec.ingress() {
		if r.SandboxID == sb.ID && r.Action == "deny" && r.Extra["status"] == http.StatusForbidden {
			refused = true
		}
	}
	if !refused {
		t.Errorf("no ingress deny record with status 403 for the service worker fetch: %+v", rec.ingress())
	}
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}
