package gateway

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/airlockdev/airlock/opensandbox"
)

// The Chrome DevTools Protocol on opensandbox.CDPPort, proxied so that a client can
// follow what it answers (https://chromedevtools.github.io/devtools-protocol/, "HTTP
// Endpoints"):
//
//   - Chromium refuses HTTP requests whose Host is neither an IP address nor localhost
//     (DNS rebinding protection), so the request goes up with the sandbox's address
//     (the dial address, IP:port) as Host;
//   - its /json, /json/list, /json/version and /json/new answers name that address in
//     webSocketDebuggerUrl ("ws://<ip>:9222/devtools/page/<id>") and devtoolsFrontendUrl
//     ("…?ws=<ip>:9222/devtools/page/<id>"): the gateway rewrites both to the address
//     the client used (its Host, with the route's path prefix in the path forms; wss
//     when the client came over TLS), so the URLs lead back through the gateway, with
//     the same routing form. A client following them sends the same credential (and,
//     in the header forms, the same routing headers) again.
//
// Only answers with a JSON Content-Type and at most cdpMaxBody bytes are rewritten
// (buffered whole, then sent with their new Content-Length); larger or other answers
// and the WebSockets themselves pass untouched.

// cdpMaxBody bounds a /json answer the gateway buffers to rewrite (bytes). A browser
// with a few hundred targets answers well under it.
const cdpMaxBody = 1 << 20

// isCDPJSON reports whether a request to port goes to a DevTools /json endpoint whose
// answer is rewritten (path after the route's prefix).
func isCDPJSON(port int, path string) bool {
	return port == opensandbox.CDPPort && (path == "/json" || strings.HasPrefix(path, "/json/"))
}

// cdpRewriter is the response writer of one /json request: it holds back a 200 JSON
// answer up to cdpMaxBody and writes it rewritten in finish.
type cdpRewriter struct {
	caddyhttp.ResponseWriterWrapper
	// from is what the answer names (the dial address, IP:port), to what replaces it
	// (public host and path prefix), scheme ws or wss.
	from, to, scheme string
	// buffering: a 200 JSON answer is being held; passing: headers went out unchanged.
	buffering, passing bool
	status             int
	buf                bytes.Buffer
}

func newCDPRewriter(w http.ResponseWriter, dial, publicHost, prefix string, tls bool) *cdpRewriter {
	scheme := "ws"
	if tls {
		scheme = "wss"
	}
	return &cdpRewriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		from: dial, to: publicHost + prefix, scheme: scheme}
}

// WriteHeader holds back a 200 whose Content-Type is JSON; anything else goes out as is.
func (c *cdpRewriter) WriteHeader(code int) {
	if c.buffering || c.passing {
		return
	}
	ct := c.Header().Get("Content-Type")
	if code == http.StatusOK && strings.HasPrefix(ct, "application/json") && c.Header().Get("Content-Encoding") == "" {
		c.buffering, c.status = true, code
		return
	}
	if code >= 200 {
		c.passing = true
	}
	c.ResponseWriterWrapper.WriteHeader(code)
}

// Write buffers a held answer; past cdpMaxBody it sends what it holds unchanged and
// passes the rest through.
func (c *cdpRewriter) Write(b []byte) (int, error) {
	if !c.buffering && !c.passing {
		c.WriteHeader(http.StatusOK)
	}
	if c.passing {
		return c.ResponseWriterWrapper.Write(b)
	}
	if c.buf.Len()+len(b) <= cdpMaxBody {
		return c.buf.Write(b)
	}
	c.buffering, c.passing = false, true
	c.ResponseWriterWrapper.WriteHeader(c.status)
	if _, err := c.ResponseWriterWrapper.Write(c.buf.Bytes()); err != nil {
		return 0, err
	}
	c.buf.Reset()
	return c.ResponseWriterWrapper.Write(b)
}

// FlushError keeps a held answer held (reverse_proxy flushes as it copies).
func (c *cdpRewriter) FlushError() error {
	if c.buffering {
		return nil
	}
	return http.NewResponseController(c.ResponseWriterWrapper.ResponseWriter).Flush()
}

// finish writes a held answer, rewritten, with its new length.
func (c *cdpRewriter) finish() {
	if !c.buffering {
		return
	}
	c.buffering, c.passing = false, true
	body := rewriteCDP(c.buf.Bytes(), c.from, c.to, c.scheme)
	c.Header().Set("Content-Length", strconv.Itoa(len(body)))
	c.ResponseWriterWrapper.WriteHeader(c.status)
	_, _ = c.ResponseWriterWrapper.Write(body)
}

// rewriteCDP replaces the sandbox-side DevTools addresses in a /json answer: the
// WebSocket URLs "ws://<from>/…" become "<scheme>://<to>/…", and the frontend's
// "ws=<from>/…" parameter "<scheme>=<to>/…" (the DevTools frontend reads ws= or wss=).
func rewriteCDP(body []byte, from, to, scheme string) []byte {
	body = bytes.ReplaceAll(body, []byte("ws://"+from+"/"), []byte(scheme+"://"+to+"/"))
	return bytes.ReplaceAll(body, []byte("ws="+from+"/"), []byte(scheme+"="+to+"/"))
}
