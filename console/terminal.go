package console

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// The sandbox page's terminal (assets/terminal.js, xterm.js from assets/xterm) drives
// execd's PTY sessions (execd-pty.md) through these routes. A browser's WebSocket
// cannot carry the API key header, and the key never reaches the page, so the console
// opens the PTY upstream itself: the session cookie admits the browser, and the console
// calls lifecycle's server proxy in-process (/sandboxes/{id}/proxy/44772/pty…) with the
// session's key, as the API routes do (with --no-auth, the sandbox's own credential
// from GET /v1/sandboxes/{id}/endpoints/44772). The server proxy admits the key (a
// user's key reaches its own sandboxes only), and records every open, attach and
// close (package audit/execdaudit, route server_proxy, with the principal).
//
//	POST   /console/api/sandboxes/{id}/pty               {"cwd"?} → execd's {"session_id"}
//	GET    /console/api/sandboxes/{id}/pty/{sid}/ws?since=&takeover=&pty=   WebSocket
//	DELETE /console/api/sandboxes/{id}/pty/{sid}         204
//
// POST and DELETE are writes (CSRF token, same origin). The WebSocket upgrade is a GET
// that a browser cannot give the CSRF header: it must come with the session cookie
// (SameSite=Strict) and pass the same-origin check on Origin, which browsers always send
// on a WebSocket handshake (RFC 6455 §4.1); a handshake without Origin is refused.
// Answers (errors included) are execd's or the proxy's own.

// ptyIDs matches a sandbox id or a PTY session id in a console terminal route.
var ptyIDs = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)

// wsHeaders are the handshake headers passed upstream with a PTY's WebSocket (RFC 6455
// §4.1); Origin stops at the console, which checked it.
var wsHeaders = []string{"Connection", "Upgrade", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
	"Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol"}

// ptyQuery are the query parameters of the WebSocket execd reads (execd-pty.md §2).
var ptyQuery = []string{"since", "takeover", "pty"}

// maxPTYBody bounds a PTY create's body (execd takes {"cwd"}).
const maxPTYBody = 64 << 10

func (c *Console) terminalRoutes(m *http.ServeMux) {
	m.Handle("POST /console/api/sandboxes/{id}/pty", c.write(c.handlePTYCreate))
	m.Handle("GET /console/api/sandboxes/{id}/pty/{sid}/ws", c.read(c.handlePTYSocket))
	m.Handle("DELETE /console/api/sandboxes/{id}/pty/{sid}", c.write(c.handlePTYDelete))
}

func (c *Console) handlePTYCreate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPTYBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "INVALID_REQUEST", "the request body is too large")
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	c.ptyUpstream(w, r, http.MethodPost, "/pty", body)
}

func (c *Console) handlePTYDelete(w http.ResponseWriter, r *http.Request) {
	c.ptyUpstream(w, r, http.MethodDelete, "/pty/"+r.PathValue("sid"), nil)
}

func (c *Console) handlePTYSocket(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Origin") == "" {
		writeError(w, http.StatusForbidden, "CSRF_FAILED", "a terminal WebSocket needs an Origin header")
		return
	}
	if err := c.origins.check(r); err != nil {
		c.log.Warn("console terminal refused", "reason", err.Error(), "path", r.URL.Path, "client", r.RemoteAddr)
		writeError(w, http.StatusForbidden, "CSRF_FAILED", err.Error())
		return
	}
	c.ptyUpstream(w, r, http.MethodGet, "/pty/"+r.PathValue("sid")+"/ws", nil)
}

// ptyUpstream sends method rest (below execd's root) to sandbox {id}'s execd through
// lifecycle's server proxy, in-process, with the session's credential, and writes the
// answer (or the upgraded WebSocket) to w.
func (c *Console) ptyUpstream(w http.ResponseWriter, r *http.Request, method, rest string, body []byte) {
	id, sid := r.PathValue("id"), r.PathValue("sid")
	if !ptyIDs.MatchString(id) || (sid != "" && !ptyIDs.MatchString(sid)) {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "malformed sandbox or session id")
		return
	}
	hdr := http.Header{}
	if k := sessionOf(r).apiKey; k != "" {
		hdr.Set(opensandbox.HeaderAPIKey, k)
	} else {
		// No API key (--no-auth): execd's port still needs the sandbox's own token,
		// which its endpoint gives; the API decides whether this session may have it.
		var ep lifecycle.Endpoint
		if err := c.apiGet(r.Context(), "/v1/sandboxes/"+url.PathEscape(id)+"/endpoints/"+strconv.Itoa(opensandbox.ExecdPort), &ep); err != nil {
			writeAPIError(w, err)
			return
		}
		for k, v := range ep.Headers {
			hdr.Set(k, v)
		}
	}
	if v := r.Header.Get(opensandbox.HeaderRequestID); v != "" {
		hdr.Set(opensandbox.HeaderRequestID, v)
	}
	q := url.Values{}
	if method == http.MethodGet {
		for _, k := range wsHeaders {
			for _, v := range r.Header.Values(k) {
				hdr.Add(k, v)
			}
		}
		for _, k := range ptyQuery {
			if v := r.URL.Query().Get(k); v != "" {
				q.Set(k, v)
			}
		}
	} else {
		hdr.Set("Content-Type", "application/json")
	}
	req := r.Clone(r.Context())
	req.Method = method
	req.URL = &url.URL{Path: "/sandboxes/" + id + "/proxy/" + strconv.Itoa(opensandbox.ExecdPort) + rest, RawQuery: q.Encode()}
	req.RequestURI = ""
	req.Header = hdr
	req.Body, req.ContentLength = http.NoBody, 0
	if body != nil {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	c.cfg.API.ServeHTTP(w, req)
}
