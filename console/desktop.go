package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/opensandbox"
)

// The desktop view of a sandbox running airlock/desktop (sandboximage.DesktopRecipe):
// noVNC's page embedded in the sandbox's console page through the gateway, under a
// short-lived signed URL the console mints with the session's key, and a screenshot of
// the whole display taken inside the sandbox.

// DesktopLinkTTL is how long a live-desktop link the console mints stays valid.
const DesktopLinkTTL = 10 * time.Minute

// desktopScreenshotCmd is the desktop image's screenshot script
// (sandboximage.DesktopScreenshot) and the file it writes; the console reads it back.
const (
	desktopScreenshotCmd  = "/opt/airlock/screenshot.sh"
	desktopScreenshotFile = "/tmp/.airlock-console-screenshot.png"
)

// maxScreenshot bounds a screenshot's size (a 1280×800 desktop is well under 1 MiB).
const maxScreenshot = 16 << 20

// desktopLink is the body of GET /console/api/sandboxes/{id}/desktop.
type desktopLink struct {
	// URL opens noVNC's page (vnc.html, connecting at once) in the host form of a
	// signed route: "<scheme>://6080-<id>-<exp>-<tag>.<domain>[:<port>]/vnc.html?…".
	URL string `json:"url"`
	// ExpiresAt is when the signed route stops working (a connected session stays).
	ExpiresAt time.Time `json:"expiresAt"`
}

// handleDesktop answers GET /console/api/sandboxes/{id}/desktop: a live-desktop link
// valid for DesktopLinkTTL. Lifecycle mints the signed endpoint with the session's key
// (so the key's role decides); the console turns its path form into the host form,
// where noVNC runs as a page of its own origin (the gateway's path forms put pages in
// an opaque origin, where noVNC's module scripts do not load). 501 when the gateway
// routes no host names (Config.GatewayDomain empty).
func (c *Console) handleDesktop(w http.ResponseWriter, r *http.Request) {
	if c.cfg.GatewayDomain == "" {
		writeError(w, http.StatusNotImplemented, "DESKTOP_UNAVAILABLE",
			"the live desktop needs the gateway's host routing (gateway.baseDomain or routeDomains)")
		return
	}
	id := r.PathValue("id")
	exp := c.cfg.Now().Add(DesktopLinkTTL).Truncate(time.Second)
	var ep struct {
		Endpoint string `json:"endpoint"`
	}
	path := fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d?expires=%d", url.PathEscape(id), opensandbox.NoVNCPort, exp.Unix())
	if err := c.apiGet(r.Context(), path, &ep); err != nil {
		writeAPIError(w, err)
		return
	}
	u, err := desktopURL(c.cfg.EndpointScheme, c.cfg.GatewayDomain, ep.Endpoint)
	if err != nil {
		c.log.Error("desktop link failed", "sandbox_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "the console could not build the desktop link")
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, desktopLink{URL: u, ExpiresAt: exp.UTC()})
}

// desktopURL turns lifecycle's signed path-form endpoint "<gateway>/<id>/<port>/<exp>/<tag>"
// into noVNC's page under the same route as a host label (gateway/README.md, "Signed
// routes": the tag covers id, port and expiry, not the form). Errors: not a signed
// path, or a label longer than 63 octets.
func desktopURL(scheme, domain, endpoint string) (string, error) {
	gw, rest, _ := strings.Cut(endpoint, "/")
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || gw == "" {
		return "", fmt.Errorf("not a signed path endpoint: %q", endpoint)
	}
	exp, err := signedurl.ParseExpiry(parts[2])
	if err != nil {
		return "", err
	}
	rt := signedurl.Route{ID: parts[0], ExpiresB36: parts[2], Tag: parts[3], Expires: time.Unix(int64(exp), 0)}
	if _, err := fmt.Sscan(parts[1], &rt.Port); err != nil {
		return "", fmt.Errorf("not a signed path endpoint: %q", endpoint)
	}
	label, err := rt.Label()
	if err != nil {
		return "", err
	}
	host := label + "." + strings.Trim(domain, ".")
	if _, port, err := net.SplitHostPort(gw); err == nil && port != "" &&
		!(scheme == "http" && port == "80") && !(scheme == "https" && port == "443") {
		host = net.JoinHostPort(host, port)
	}
	return scheme + "://" + host + "/vnc.html?autoconnect=true&resize=scale&reconnect=true&show_dot=true", nil
}

// frameSources is the console's CSP frame-src for the live desktop: any port of any
// host under the gateway's domain, or nothing.
func (c *Console) frameSources() string {
	if c.cfg.GatewayDomain == "" {
		return ""
	}
	return "; frame-src " + c.cfg.EndpointScheme + "://*." + strings.Trim(c.cfg.GatewayDomain, ".") + ":*"
}

// handleScreenshot answers POST /console/api/sandboxes/{id}/screenshot with a PNG of
// the sandbox's whole display: execd runs the desktop image's screenshot script (scrot)
// inside the sandbox and the console downloads the file, both through lifecycle's server
// proxy in-process with the credential the endpoint of execd's port lists (and the
// session's key). 502 when the command fails (not a desktop sandbox, no display).
func (c *Console) handleScreenshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var ep struct {
		Headers map[string]string `json:"headers"`
	}
	if err := c.apiGet(r.Context(), fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", url.PathEscape(id), opensandbox.ExecdPort), &ep); err != nil {
		writeAPIError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	execd := "/sandboxes/" + url.PathEscape(id) + "/proxy/" + fmt.Sprint(opensandbox.ExecdPort)
	cmd, _ := json.Marshal(map[string]string{"command": desktopScreenshotCmd + " " + desktopScreenshotFile})
	st, out := c.proxyCall(ctx, http.MethodPost, execd+"/command", cmd, ep.Headers)
	if msg := commandFailure(st, out); msg != "" {
		writeError(w, http.StatusBadGateway, "SCREENSHOT_FAILED", "the screenshot command failed in the sandbox: "+msg)
		return
	}
	st, png := c.proxyCall(ctx, http.MethodGet, execd+"/files/download?path="+url.QueryEscape(desktopScreenshotFile), nil, ep.Headers)
	if st != http.StatusOK || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		writeError(w, http.StatusBadGateway, "SCREENSHOT_FAILED", fmt.Sprintf("reading the screenshot from the sandbox failed (%d)", st))
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", fmt.Sprint(len(png)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(png)
}

// proxyCall sends one request to lifecycle's server proxy in-process with hdr and the
// session's key, and returns the status and at most maxScreenshot bytes of the body.
func (c *Console) proxyCall(ctx context.Context, method, path string, body []byte, hdr map[string]string) (int, []byte) {
	req := httptest.NewRequestWithContext(ctx, method, path, bytes.NewReader(body))
	req.RemoteAddr = "127.0.0.1:0"
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if s, _ := ctx.Value(ctxKey{}).(*session); s != nil && s.apiKey != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, s.apiKey)
	}
	rec := httptest.NewRecorder()
	c.cfg.API.ServeHTTP(rec, req)
	b, _ := io.ReadAll(io.LimitReader(rec.Body, maxScreenshot))
	return rec.Code, b
}

// commandFailure reads execd's command stream (one JSON event per line,
// docs/spec/execd-api.yaml) and returns why it failed, "" when it succeeded.
func commandFailure(status int, stream []byte) string {
	if status != http.StatusOK {
		var e opensandbox.ErrorBody
		if json.Unmarshal(stream, &e) == nil && e.Message != "" {
			return e.Message
		}
		return fmt.Sprintf("execd answered %d", status)
	}
	var stderr strings.Builder
	for _, line := range bytes.Split(stream, []byte("\n")) {
		var ev struct {
			Type  string `json:"type"`
			Text  string `json:"text"`
			Error *struct {
				Value string `json:"evalue"`
			} `json:"error"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &ev) != nil {
			continue
		}
		switch {
		case ev.Type == "stderr":
			stderr.WriteString(ev.Text)
		case ev.Type == "error" && ev.Error != nil:
			return fmt.Sprintf("exit status %s: %.200s", ev.Error.Value, strings.TrimSpace(stderr.String()))
		}
	}
	return ""
}
