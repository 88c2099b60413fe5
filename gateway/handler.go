package gateway

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/internal/pathform"
	"github.com/airlockdev/airlock/opensandbox"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Request variables the handler sets; also readable as placeholders, for example
// {http.vars.airlock.sandbox_id} in access logs.
const (
	// VarDial is the upstream "host:port" the request goes to.
	VarDial = "airlock.dial"
	// VarSandboxID is the sandbox's id.
	VarSandboxID = "airlock.sandbox_id"
)

// Handler routes a request to a sandbox port, admits it, and proxies it. Module ID
// http.handlers.airlock; Caddyfile directive `airlock` (see UnmarshalCaddyfile).
//
// Order of work per request: parse the route (header, host label, path), look the
// sandbox up in the airlock app's table (no I/O), check its state and expiry, check
// access (public, or on token ports the sandbox's token, a signed URL or the API key;
// execd 44772 and the egress API 18080 are always token ports), take a connection slot
// under the per-sandbox cap, send a throttled renew intent if the sandbox opted in, strip
// the gateway's headers (OpenSandbox-Ingress-To, X-Airlock-Sandbox, X-Airlock-Port,
// X-Airlock-Access-Token, OpenSandbox-Secure-Access, OPEN-SANDBOX-API-KEY, and
// X-EXECD-ACCESS-TOKEN except on execd's port, where the gateway sets the sandbox's own
// when it has the execd key) and the path prefix of path forms (X-Forwarded-Prefix tells
// the app what was stripped), then proxy. Path forms share one browser origin and are
// hardened (internal/pathform): service worker scripts are refused (403), and responses lose
// Service-Worker-Allowed, get cookies scoped to the route's prefix and a CSP sandbox on
// documents. Denials are JSON {code, message, requestId}
// with statuses 400, 401, 403, 404, 410, 429 or 503 (with Retry-After); an unreachable
// upstream is 502. Every response carries X-Request-Id (the client's, when it sent a
// sane one). A request in flight to a sandbox that is deleted is cut off.
type Handler struct {
	// BaseDomains overrides the app's base domains for this handler.
	BaseDomains []string `json:"base_domains,omitempty"`

	// Proxy configures the embedded reverse_proxy (transport, timeouts, headers, …). Its
	// upstreams are always the airlock dynamic source; leave upstreams out. Default:
	// Caddy's defaults, which flush streaming and chunked responses immediately.
	Proxy *reverseproxy.Handler `json:"proxy,omitempty"`

	// RouteOnly makes the handler route, admit and rewrite, then call the next handler
	// instead of its own proxy; the next handler is expected to be a reverse_proxy with
	// `dynamic airlock` upstreams.
	RouteOnly bool `json:"route_only,omitempty"`

	app *App
	dec decider
	// cutByConn: the proxy's transport dials through app.upstream, so deleting a
	// sandbox closes its connections and no per-request context is needed.
	cutByConn bool
	log       *slog.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.airlock", New: func() caddy.Module { return new(Handler) }}
}

// Provision binds the handler to the airlock app and provisions the embedded proxy.
// egressAPIProxy is the path segment of lifecycle's server proxy for the egress API
// port: /sandboxes/<id>/proxy/18080/<path>.
var egressAPIProxy = "/proxy/" + strconv.Itoa(opensandbox.EgressAPIPort)

func (h *Handler) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("airlock")
	if err != nil {
		return fmt.Errorf("airlock handler: %w", err)
	}
	h.app = appIface.(*App)
	h.log = h.app.log
	domains := h.app.domains
	if len(h.BaseDomains) > 0 {
		if domains, err = normalizeDomains(h.BaseDomains); err != nil {
			return err
		}
	}
	h.dec = decider{table: h.app.table, keys: h.app.keys, apiKey: h.app.apiKey, execdKey: h.app.execdKey, domains: domains}
	if h.app.watcher != nil {
		h.dec.synced = func() bool { return h.app.watcher.Status().Synced }
	}
	if h.RouteOnly {
		return nil
	}
	if h.Proxy == nil {
		h.Proxy = new(reverseproxy.Handler)
	}
	if len(h.Proxy.Upstreams) > 0 {
		return fmt.Errorf("airlock handler: proxy upstreams are chosen per request; remove the static upstreams")
	}
	if h.Proxy.DynamicUpstreamsRaw == nil {
		h.Proxy.DynamicUpstreamsRaw = json.RawMessage(`{"source":"airlock"}`)
	}
	if err := h.Proxy.Provision(ctx); err != nil {
		return fmt.Errorf("airlock handler: provisioning reverse_proxy: %w", err)
	}
	// A deleted sandbox's requests end when the app closes its connections; a
	// transport that is not the standard one keeps a cancellable context per request.
	if t, ok := h.Proxy.Transport.(*reverseproxy.HTTPTransport); ok && t.Transport != nil && t.Transport.DialContext != nil {
		t.Transport.DialContext = h.app.upstream.wrap(t.Transport.DialContext)
		h.cutByConn = true
	}
	return nil
}

// Cleanup releases the embedded proxy.
func (h *Handler) Cleanup() error {
	if h.Proxy != nil && !h.RouteOnly {
		return h.Proxy.Cleanup()
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	start := time.Now()
	reqID := requestID(r)
	rid := []string{reqID} // read-only, shared by both header maps
	w.Header()[opensandbox.HeaderRequestID] = rid
	r.Header[opensandbox.HeaderRequestID] = rid
	client := clientAddr(r)

	dec := h.dec.decide(r, start, h.caller(r, start))
	if dec.err == nil && dec.cand.Prefix != "" && pathform.Refuse(r) {
		// Path forms share one origin: a service worker there would control every sandbox.
		dec = dec.deny(ErrForbidden, pathform.RefuseReason)
	}
	if dec.err == nil && !dec.entry.Acquire(h.app.maxConns) {
		dec = dec.deny(ErrOverCapacity, fmt.Sprintf("sandbox %s has %d connections in flight, the most this gateway allows", dec.sb.ID, h.app.maxConns))
		dec.retryAfter = 1
	}
	if dec.err != nil {
		st := statusOf(dec.err)
		writeError(w, st, dec.reason, reqID, dec.retryAfter)
		h.finish(start, r, &dec, st.res, st.status, 0, reqID, client)
		return nil
	}
	defer dec.entry.Release()
	h.app.renewer.touch(dec.entry, dec.sb, start)

	// A caller admitted by its own API key reaches lifecycle's egress API as itself
	// (below); the key is kept before the credentials are stripped.
	callerKey := ""
	if dec.access == "principal_key" {
		callerKey = r.Header.Get(opensandbox.HeaderAPIKey)
	}
	// Rewrite: the sandbox sees neither the gateway's headers nor the route prefix.
	for _, k := range strippedHeaders {
		delete(r.Header, k)
	}
	delete(r.Header, "X-Forwarded-Prefix")
	// execd's credential reaches execd only, and the gateway's own when it has the key.
	if dec.cand.Port != opensandbox.ExecdPort {
		delete(r.Header, opensandbox.HeaderExecdAccessToken)
	} else if tok := h.app.execdKey.Derive(dec.sb.ID); tok != "" {
		r.Header[opensandbox.HeaderExecdAccessToken] = []string{tok}
	}
	if dec.cand.Prefix != "" {
		setEscapedPath(r.URL, dec.cand.Rest(r.URL.EscapedPath()))
		r.Header["X-Forwarded-Prefix"] = []string{dec.cand.Prefix}
	}

	// The egress API port is lifecycle's (App.EgressAPI), with the operator's credential,
	// or the caller's own API key when that admitted it: lifecycle then checks and
	// records the call as that principal's, not the gateway's.
	if eg := h.app.EgressAPI; eg != nil && dec.cand.Port == opensandbox.EgressAPIPort {
		setEscapedPath(r.URL, "/sandboxes/"+dec.sb.ID+egressAPIProxy+r.URL.EscapedPath())
		for k, v := range eg.Headers {
			r.Header[http.CanonicalHeaderKey(k)] = v
		}
		if callerKey != "" {
			r.Header.Set(opensandbox.HeaderAPIKey, callerKey)
		}
		dec.dial = eg.Dial
	}

	// The request ends when the client goes or the sandbox is deleted: the app closes a
	// deleted sandbox's connections (cutByConn); other transports get a context per
	// request that the deletion cancels.
	ctx := r.Context()
	if !h.cutByConn {
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(dec.entry.Context(), cancel)
		defer stop()
		r = r.WithContext(c)
		ctx = c
	}
	caddyhttp.SetVar(ctx, VarDial, dec.dial)
	caddyhttp.SetVar(ctx, VarSandboxID, dec.sb.ID)

	rec := newRecorder(w)
	rec.hold499 = true
	rec.prefix = dec.cand.Prefix
	// An agent action through execd is recorded here, on the host (package
	// audit/execdaudit): the body and the response are observed as they pass.
	if dec.cand.Port == opensandbox.ExecdPort {
		info := execdaudit.Info{SandboxID: dec.sb.ID, RequestID: reqID, Client: client, InitPID: dec.sb.Runtime.Pid}
		if info.InitPID <= 0 {
			// No view of the sandbox's /proc here (a pod): its node's egressd looks.
			info.Groups = h.app.nodeGroups.For(dec.sb.Runtime.HostIP, dec.sb.ID)
		}
		rec.obs = h.app.agentAudit.Start(r, r.URL.Path, info)
	}
	h.app.metrics.active.Inc()
	res := resProxied
	defer func() {
		h.app.metrics.active.Dec()
		p := recover()
		if p != nil || res == resProxied && dec.entry.Context().Err() != nil {
			res = resUpstreamError
			if dec.entry.Context().Err() != nil {
				res = resGone
			}
		}
		h.finish(start, r, &dec, res, rec.status, rec.bytes, reqID, client)
		rec.obs.Finish(0)
		if p != nil {
			panic(p)
		}
	}()

	// The DevTools protocol's port: Chromium wants an IP address as Host, and its /json
	// answers name that address; they are rewritten to the client's (cdp.go).
	var out http.ResponseWriter = rec
	var cdp *cdpRewriter
	publicHost := r.Host
	if dec.cand.Port == opensandbox.CDPPort {
		if isCDPJSON(dec.cand.Port, r.URL.Path) {
			cdp = newCDPRewriter(rec, dec.dial, publicHost, dec.cand.Prefix, r.TLS != nil)
			out = cdp
		}
		r.Host = dec.dial
	}

	var err error
	if h.RouteOnly {
		err = next.ServeHTTP(out, r)
	} else {
		err = h.Proxy.ServeHTTP(out, r, next)
	}
	if cdp != nil {
		cdp.finish()
	}
	r.Host = publicHost
	switch {
	case rec.held():
		// reverse_proxy saw the request context end before a response: the client left
		// (499 stands) or the sandbox was deleted (410).
		if dec.entry.Context().Err() != nil {
			res = resGone
			writeError(rec.ResponseWriterWrapper.ResponseWriter, statusOf(ErrGone), fmt.Sprintf("sandbox %s was deleted while the request was in flight", dec.sb.ID), reqID, 0)
			rec.status = http.StatusGone
		} else {
			rec.release()
		}
	case err != nil && dec.entry.Context().Err() != nil:
		// The sandbox was deleted while the request was in flight: its connection was cut.
		res = resGone
		if !rec.wroteHeader() {
			writeError(rec, statusOf(ErrGone), fmt.Sprintf("sandbox %s was deleted while the request was in flight", dec.sb.ID), reqID, 0)
		}
	case err != nil && !rec.wroteHeader():
		res = resUpstreamError
		h.log.Debug("upstream request failed", "sandbox_id", dec.sb.ID, "port", dec.cand.Port, "err", err)
		writeError(rec, statusOf(ErrUpstream), fmt.Sprintf("sandbox %s did not answer on port %d", dec.sb.ID, dec.cand.Port), reqID, 0)
	case err != nil:
		res = resUpstreamError
		h.log.Debug("upstream response failed", "sandbox_id", dec.sb.ID, "port", dec.cand.Port, "err", err)
	}
	return nil
}

// finish records metrics and the audit record of one request.
func (h *Handler) finish(start time.Time, r *http.Request, dec *decision, res result, status int, bytes int64, reqID, client string) {
	m := h.app.metrics
	m.requests[dec.cand.Form][res].Inc()
	m.duration[res].Observe(time.Since(start).Seconds())
	if h.app.audit != nil {
		h.app.audit.Append(record(start, r, dec, res, status, bytes, reqID, client))
	}
}

// requestID returns the client's X-Request-Id when it is 1..128 visible ASCII characters,
// else a fresh random one.
func requestID(r *http.Request) string {
	if id := r.Header.Get(opensandbox.HeaderRequestID); id != "" && len(id) <= 128 {
		ok := true
		for i := 0; i < len(id) && ok; i++ {
			ok = id[i] > ' ' && id[i] < 0x7f
		}
		if ok {
			return id
		}
	}
	// Unique, not secret: a fast non-cryptographic source is enough.
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32())
	return hex.EncodeToString(b[:])
}

// setEscapedPath sets u's path from an escaped path.
func setEscapedPath(u *url.URL, escaped string) {
	p, err := url.PathUnescape(escaped)
	if err != nil {
		p = escaped
	}
	u.Path = p
	u.RawPath = ""
	if u.EscapedPath() != escaped {
		u.RawPath = escaped
	}
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// caller looks up the principal of the request's API key when it is not the configured
// one and the app admits other keys (App.PrincipalKeys); nil otherwise.
func (h *Handler) caller(r *http.Request, now time.Time) *keyCaller {
	if h.app.principals == nil {
		return nil
	}
	key, ok := accesstoken.APIKey(r.Header)
	if !ok || key == "" || h.dec.apiKey.Matches(key) {
		return nil
	}
	p, known, err := h.app.principals.lookup(r.Context(), key, now)
	return &keyCaller{p: p, known: known, err: err}
}
