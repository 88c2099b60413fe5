package lifecycle

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// AccessTokenHeader is the header under which an endpoint of a token port (execd, the
// egress API, and every port of a secureAccess sandbox or under Config.DefaultAccess
// token) lists the sandbox's access token, spelled as OpenSandbox's SDKs expect it in
// the endpoint's headers; they send it back with every request (OSEP-0011). Requests
// may carry the token under it (opensandbox.HeaderSecureAccess, its canonical form) or
// under opensandbox.HeaderAccessToken.
const AccessTokenHeader = "OpenSandbox-Secure-Access"

// ExecdTokenHeader is the header under which the endpoint of execd's port lists the
// sandbox's execd token, spelled as OpenSandbox's execd API and SDKs spell it
// (execd-api.yaml, securitySchemes AccessToken); requests arrive with it as
// opensandbox.HeaderExecdAccessToken.
const ExecdTokenHeader = "X-EXECD-ACCESS-TOKEN"

// newAccessToken returns a sandbox access token: 256 random bits as 64 hex digits.
func newAccessToken() string { return randomHex(32) }

// migrateAccess brings a record written before every sandbox had an access token up to
// date: such a record has no SecureAccess flag, and a token then meant secureAccess; a
// sandbox without one gets one now. It reports whether rec changed (then it must be
// persisted).
func migrateAccess(rec *record) bool {
	changed := false
	if rec.SecureAccess == nil {
		secure := rec.AccessToken != ""
		rec.SecureAccess = &secure
		changed = true
	}
	if rec.AccessToken == "" {
		rec.AccessToken = newAccessToken()
		changed = true
	}
	return changed
}

// secure reports whether the sandbox was created with secureAccess.
func (rec *record) secure() bool { return rec.SecureAccess != nil && *rec.SecureAccess }

// accessRules decide the admission mode of a sandbox's ports: token on the control
// ports (execd's, the egress API's, the DevTools protocol's, VNC's and noVNC's) and on every port of a secureAccess sandbox, else
// the operator's default. The gateway applies the same rules from the watch.
type accessRules struct {
	// execdPort is Config.ExecdPort; fallback is Config.DefaultAccess.
	execdPort int
	fallback  watch.AccessMode
}

// portMode is the admission mode of port of a sandbox (secure: created with
// secureAccess).
func (a accessRules) portMode(secure bool, port int) watch.AccessMode {
	if secure || port == a.execdPort || opensandbox.IsControlPort(port) {
		return watch.Token
	}
	return a.fallback
}

// watchAccess is what the data plane learns of rec's admission rules: the default
// mode, the control ports always token, and the SHA-256 of the token (never the token).
func (a accessRules) watchAccess(rec *record) watch.Access {
	w := watch.Access{
		Mode:  a.fallback,
		Ports: map[int]watch.AccessMode{a.execdPort: watch.Token},
	}
	for _, p := range opensandbox.ControlPorts {
		w.Ports[p] = watch.Token
	}
	if rec.secure() {
		w.Mode = watch.Token
	}
	if rec.AccessToken != "" {
		sum := sha256.Sum256([]byte(rec.AccessToken))
		w.TokenSHA256 = hex.EncodeToString(sum[:])
	}
	w.SignedEpoch = rec.SignedURLEpoch
	return w
}

// Server proxy routes: Handler leaves their authentication to serverProxy.admit.
const (
	proxyPattern     = "/sandboxes/{id}/proxy/{port}"
	proxyRestPattern = "/sandboxes/{id}/proxy/{port}/{rest...}"
)

// isProxyRoute reports whether r goes to the server proxy. It asks the mux, so it
// agrees with the dispatch exactly; a path the mux would redirect is not a proxy route
// (the API key gate applies).
func (s *Server) isProxyRoute(r *http.Request) bool {
	_, pat := s.mux.Handler(r)
	return pat == proxyPattern || pat == proxyRestPattern
}

// proxySandbox is what the server proxy knows of the sandbox a request names.
type proxySandbox struct {
	found  bool
	token  string
	secure bool
	owner  string
	// initPID is the host pid of the sandbox's init (execd), for command records' process
	// groups (execdaudit.Info.InitPID).
	initPID int
	// hostIP is the address of the sandbox's node when the runtime reports one
	// (Kubernetes), where its egressd looks for command groups (Config.NodeGroups).
	hostIP string
}

// gatewayPrincipal is the principal of requests the gateway forwards with its key.
var gatewayPrincipal = principal.Principal{ID: "gateway", Name: "gateway (forwarded egress API request)", Role: principal.Operator}

// admit decides whether r may use the server proxy to port of sandbox id, and returns
// the principal it admitted (zero when a sandbox token admitted it): an API key whose
// role may use sandboxes admits any sandbox (admin, operator) or its own (user: another
// principal's sandbox is 404 SANDBOX_NOT_FOUND, as an unknown one); the gateway key
// admits any sandbox; the sandbox's own access token (header OpenSandbox-Secure-Access
// or X-Airlock-Access-Token) admits that sandbox only and, when present, decides on its
// own (a wrong token is refused); so does its execd token (X-EXECD-ACCESS-TOKEN) for
// execd's port. With no API key configured (--no-auth) a request without a token
// passes on public ports only: execd and the egress API always need the token. An
// auditor's key is refused (403 FORBIDDEN); other refusals wrap ErrAccessDenied (401).
func (p *serverProxy) admit(r *http.Request, id string, port int, sb proxySandbox) (principal.Principal, error) {
	key := r.Header.Get(opensandbox.HeaderAPIKey)
	if who, ok := p.keys.Authenticate(key); ok {
		switch {
		case !who.Role.Allows(principal.UseSandbox):
			return principal.Principal{}, fmt.Errorf("%w: the %s role of %s may not %s", ErrForbidden, who.Role, who.ID, principal.UseSandbox)
		case !who.Role.OwnsAll() && sb.found && sb.owner != who.ID:
			return principal.Principal{}, fmt.Errorf("%w: %q", ErrNotFound, id)
		}
		return who, nil
	}
	if p.gatewayKey != "" && secretEqual(key, p.gatewayKey) {
		return gatewayPrincipal, nil
	}
	tok, present := r.Header[opensandbox.HeaderAccessToken]
	if !present {
		tok, present = r.Header[opensandbox.HeaderSecureAccess]
	}
	if present && sb.found {
		if len(tok) > 0 && sb.token != "" && secretEqual(tok[0], sb.token) {
			return principal.Principal{}, nil
		}
		return principal.Principal{}, fmt.Errorf("%w: the access token does not match sandbox %s", ErrAccessDenied, id)
	}
	// The execd token (as the endpoint of execd's port lists it, OpenSandbox's header)
	// admits that port of its own sandbox only, and decides on its own too.
	if et, ok := r.Header[opensandbox.HeaderExecdAccessToken]; ok && sb.found && port == p.rules.execdPort {
		if len(et) > 0 && p.execdKey.Matches(id, et[0]) {
			return principal.Principal{}, nil
		}
		return principal.Principal{}, fmt.Errorf("%w: the execd token does not match sandbox %s", ErrAccessDenied, id)
	}
	if !p.auth && (!sb.found || p.rules.portMode(sb.secure, port) == watch.Public) {
		return principal.Principal{}, nil
	}
	return principal.Principal{}, fmt.Errorf("%w: port %d of sandbox %s needs its access token (%s, or X-EXECD-ACCESS-TOKEN for execd's port, as GET /sandboxes/%s/endpoints/%d gives in headers) or OPEN-SANDBOX-API-KEY",
		ErrAccessDenied, port, id, AccessTokenHeader, id, port)
}

// secretEqual compares two secrets in constant time (of their SHA-256, so the length of
// the expected one does not leak either).
func secretEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// auditRefusal records a server proxy refusal (source ingress): who, which sandbox and
// port, why; never the credential.
func (p *serverProxy) auditRefusal(r *http.Request, id string, port int, mode watch.AccessMode, err error) {
	if p.audit == nil {
		return
	}
	status, body, _ := httpError(err)
	p.audit.Append(audit.Record{
		Time: time.Now().UTC(), SandboxID: id, Source: audit.SourceIngress, Proto: "http",
		Src: r.RemoteAddr, DstHost: r.Host, DstPort: port, Action: "deny", Reason: body.Message,
		Rule: "access:" + string(mode),
		Extra: map[string]any{
			"route": "server_proxy", "status": status,
			"request_id": r.Header.Get(opensandbox.HeaderRequestID), "method": r.Method,
			"principal": principal.IDFromContext(r.Context()),
		},
	})
}
