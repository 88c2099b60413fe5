package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/internal/pathform"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// strippedHeaders never reach a sandbox through the proxy: they are the platform's
// credentials, not the sandbox's. The execd token is set again, by the proxy, on
// requests to execd's port only.
var strippedHeaders = []string{opensandbox.HeaderAPIKey, opensandbox.HeaderSecureAccess, opensandbox.HeaderAccessToken,
	opensandbox.HeaderExecdAccessToken}

type proxyTargetKey struct{}

type proxyTarget struct {
	host    string // ip:port
	rawPath string // escaped path below the proxy prefix, starting with /
	// execdToken is sent in X-EXECD-ACCESS-TOKEN ("" for ports other than execd's).
	execdToken string
	// prefix is the route's escaped path prefix (/sandboxes/<id>/proxy/<port>), under
	// which the response's cookies are scoped (pathform.Harden).
	prefix string
	// act observes an agent action through execd (nil for anything else).
	act *execdaudit.Action
}

// serverProxy serves /sandboxes/{id}/proxy/{port}/… (the OpenSandbox server proxy):
// any method, any port, to the sandbox's address on the Airlock network, once admit
// has admitted the request (refusals are 401 and audited with source ingress). It is a
// path form on lifecycle's own origin, hardened like the gateway's (package pathform:
// service worker fetches 403, cookies scoped under the prefix, documents sandboxed). Sandbox
// port 18080 is the egress API, which lifecycle answers itself (policyAPI).
type serverProxy struct {
	// peek runs fn on a sandbox's record under the registry lock (Server.peek).
	reg interface {
		peek(id string, fn func(rec *record)) bool
	}
	rules accessRules
	// keys authenticates API keys (principals); auth is false without authentication
	// (--no-auth); gatewayKey is Config.GatewayKey.
	keys       *principal.Keyring
	auth       bool
	gatewayKey string
	// execdKey is Config.ExecdKey: it derives the token sent to (and accepted for)
	// execd's port.
	execdKey  execdtoken.Key
	egressAPI *policyAPI
	// audit receives a record per refusal; nil means none.
	audit interface{ Append(audit.Record) }
	// agentAudit records the agent actions sent to execd's port; nil: none.
	agentAudit *execdaudit.Observer
	// nodeGroups is Config.NodeGroups.
	nodeGroups *execdaudit.RemoteGroups
	log        *slog.Logger
	proxy      *httputil.ReverseProxy
	// transport is proxy's pooled transport: its idle connections are closed when a
	// sandbox goes (forget), so that none is reused against the next sandbox given the
	// same address (that sandbox would answer with resets its policy denies).
	transport *http.Transport
}

// newProxy makes the one reverse proxy every proxied request goes through: a pooled
// transport, responses flushed as they arrive (SSE event by event), WebSocket and other
// upgrades passed through, hop-by-hop headers dropped (httputil does that) and the
// platform's credentials stripped.
func (p *serverProxy) newProxy() {
	p.transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	p.proxy = &httputil.ReverseProxy{
		Transport:     p.transport,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(proxyTargetKey{}).(proxyTarget)
			path, err := url.PathUnescape(t.rawPath)
			if err != nil {
				path = t.rawPath
			}
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.host
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = t.rawPath
			pr.Out.Host = t.host
			pr.SetXForwarded()
			for _, h := range strippedHeaders {
				pr.Out.Header.Del(h)
			}
			if t.execdToken != "" {
				pr.Out.Header.Set(opensandbox.HeaderExecdAccessToken, t.execdToken)
			}
		},
		// The server proxy shares lifecycle's origin with every sandbox and the
		// console: its responses are hardened like the gateway's path forms.
		ModifyResponse: func(resp *http.Response) error {
			t := resp.Request.Context().Value(proxyTargetKey{}).(proxyTarget)
			pathform.Harden(resp.Header, t.prefix)
			// An upgrade (a PTY's WebSocket) is written on the hijacked connection,
			// past the observed writer: its status is taken here.
			t.act.WriteHeader(resp.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			// The client learns that the sandbox did not answer, never where the proxy
			// dialled (the sandbox's address): that detail goes to the log.
			p.log.Warn("server proxy: the sandbox did not answer", "sandbox_id", r.PathValue("id"), "port", r.PathValue("port"),
				"request_id", r.Header.Get(opensandbox.HeaderRequestID), "err", err)
			fail(p.log, w, r, fmt.Errorf("%w on port %s", ErrUpstream, r.PathValue("port")))
		},
	}
}

// forget drops the pooled connections after a sandbox went.
func (p *serverProxy) forget() { p.transport.CloseIdleConnections() }

// handle serves one server proxy request.
func (p *serverProxy) handle(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		fail(p.log, w, r, fmt.Errorf("%w: port must be a number from 1 to 65535", ErrInvalidRequest))
		return
	}
	var st opensandbox.State
	var addr netip.Addr
	var sb proxySandbox
	sb.found = p.reg.peek(id, func(rec *record) {
		st, addr = rec.Status.State, rec.Address
		sb.token, sb.secure, sb.owner = rec.AccessToken, rec.secure(), rec.Owner
		sb.initPID, sb.hostIP = rec.Pid, rec.HostIP
	})
	who, err := p.admit(r, id, port, sb)
	if err == nil && who.ID != "" {
		r = r.WithContext(principal.NewContext(r.Context(), who))
		noteProxyPrincipal(r, who)
	}
	if err == nil && pathform.Refuse(r) {
		// The server proxy is a path form on lifecycle's API origin, shared with every
		// sandbox and the console: a service worker there would control them all.
		err = fmt.Errorf("%w: %s", ErrForbidden, pathform.RefuseReason)
	}
	if err != nil {
		p.auditRefusal(r, id, port, p.rules.portMode(sb.secure, port), err)
		fail(p.log, w, r, err)
		return
	}
	if !sb.found {
		fail(p.log, w, r, fmt.Errorf("%w: %q", ErrNotFound, id))
		return
	}
	if st == opensandbox.Pending {
		// Not before its egress is enforced: a connection opened before the datapath
		// attached would have its replies dropped once it has (they belong to no flow
		// the filter saw start). execd holds such requests anyway.
		st, addr = p.awaitStarted(r.Context(), id)
	}
	switch st {
	case opensandbox.Running, opensandbox.Resuming:
	case opensandbox.Paused, opensandbox.Pausing:
		fail(p.log, w, r, fmt.Errorf("%w: sandbox %s is %s: resume it first (POST /sandboxes/%s/resume)", ErrInvalidState, id, st, id))
		return
	default:
		fail(p.log, w, r, fmt.Errorf("%w: sandbox %s is %s", ErrUnavailable, id, st))
		return
	}
	if !addr.IsValid() {
		fail(p.log, w, r, fmt.Errorf("%w: sandbox %s has no address yet", ErrUnavailable, id))
		return
	}
	prefix := "/sandboxes/" + id + "/proxy/" + r.PathValue("port")
	if port == opensandbox.EgressAPIPort {
		p.egressAPI.serveEgressAPI(w, r, id, "/"+r.PathValue("rest"))
		return
	}
	rest := r.URL.EscapedPath()
	if i := strings.Index(rest, prefix); i >= 0 {
		rest = rest[i+len(prefix):]
	}
	if rest == "" || rest[0] != '/' {
		rest = "/" + rest
	}
	t := proxyTarget{host: net.JoinHostPort(addr.String(), strconv.Itoa(port)), rawPath: rest, prefix: prefix}
	// Full duplex: an upstream may answer before the transport has finished reading the
	// request body (execd answers as soon as it has parsed it); without this the HTTP/1
	// server closes the body when the response starts and the upstream write fails.
	_ = http.NewResponseController(w).EnableFullDuplex()
	if port == p.rules.execdPort {
		t.execdToken = p.execdKey.Derive(id)
		// An agent action is recorded here, on the host (package audit/execdaudit).
		path, perr := url.PathUnescape(rest)
		if perr != nil {
			path = rest
		}
		info := execdaudit.Info{SandboxID: id, RequestID: r.Header.Get(opensandbox.HeaderRequestID), Client: r.RemoteAddr, InitPID: sb.initPID}
		if info.InitPID <= 0 {
			// No view of the sandbox's /proc here (a pod): its node's egressd looks.
			info.Groups = p.nodeGroups.For(sb.hostIP, id)
		}
		if act := p.agentAudit.Start(r, path, info); act != nil {
			t.act = act
			w = act.Writer(w)
			defer act.Finish(0)
		}
	}
	p.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), proxyTargetKey{}, t)))
}

// proxyPendingWait bounds how long the server proxy holds a request for a Pending
// sandbox (execd holds requests as long before answering 503 STARTING).
const proxyPendingWait = 30 * time.Second

// awaitStarted waits until sandbox id leaves Pending (or proxyPendingWait, or ctx) and
// returns its state and address then (Terminated for a sandbox that went).
func (p *serverProxy) awaitStarted(ctx context.Context, id string) (opensandbox.State, netip.Addr) {
	deadline := time.Now().Add(proxyPendingWait)
	for {
		st := opensandbox.Terminated
		var addr netip.Addr
		p.reg.peek(id, func(rec *record) { st, addr = rec.Status.State, rec.Address })
		if st != opensandbox.Pending || time.Now().After(deadline) {
			return st, addr
		}
		select {
		case <-ctx.Done():
			return st, addr
		case <-time.After(pingInterval):
		}
	}
}
