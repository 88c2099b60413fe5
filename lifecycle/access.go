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
)

// Access token headers. Every sandbox has an access token; endpoints of its token ports
// (execd, the egress API, and every port of a secureAccess sandbox or under
// Config.DefaultAccess token) list it under AccessTokenHeader, which OpenSandbox SDKs
// send back with every request (OSEP-0011). AirlockAccessTokenHeader is accepted too.
const (
	AccessTokenHeader        = "OpenSandbox-Secure-Access"
	AirlockAccessTokenHeader = "X-Airlock-Access-Token"
)

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

// portMode is the admission mode of port of a sandbox (secure: created with
// secureAccess): token on the control ports (execd, the egress API) and on every port
// of a secure sandbox, else the operator's DefaultAccess.
func (s *Server) portMode(secure bool, port int) watch.AccessMode {
	if secure || port == s.cfg.ExecdPort || port == opensandbox.EgressAPIPort {
		return watch.Token
	}
	return s.cfg.DefaultAccess
}

// access is what the data plane learns of rec's admission rules: the default mode, the
// control ports always token, and the SHA-256 of the token (never the token).
func (s *Server) access(rec *record) watch.Access {
	a := watch.Access{
		Mode:  s.cfg.DefaultAccess,
		Ports: map[int]watch.AccessMode{s.cfg.ExecdPort: watch.Token, opensandbox.EgressAPIPort: watch.Token},
	}
	if rec.secure() {
		a.Mode = watch.Token
	}
	if rec.AccessToken != "" {
		sum := sha256.Sum256([]byte(rec.AccessToken))
		a.TokenSHA256 = hex.EncodeToString(sum[:])
	}
	return a
}

// Server proxy routes: Handler leaves their authentication to admitProxy.
const (
	proxyPattern     = "/sandboxes/{id}/proxy/{port}"
	proxyRestPattern = "/sandboxes/{id}/proxy/{port}/{rest...}"
)

// isProxyRoute reports whether r goes to the server proxy (handleProxy). It asks the
// mux, so it agrees with the dispatch exactly; a path the mux would redirect is not a
// proxy route (the API key gate applies).
func (s *Server) isProxyRoute(r *http.Request) bool {
	_, pat := s.mux.Handler(r)
	return pat == proxyPattern || pat == proxyRestPattern
}

// proxySandbox is what admitProxy knows of the sandbox a proxy request names.
type proxySandbox struct {
	found  bool
	token  string
	secure bool
}

// admitProxy decides whether r may use the server proxy to port of sandbox id: the API
// key or GatewayKey admits any sandbox; the sandbox's own access token (header
// OpenSandbox-Secure-Access or X-Airlock-Access-Token) admits that sandbox only and,
// when present, decides on its own (a wrong token is refused). With no API key
// configured (--no-auth) a request without a token passes on public ports only: execd
// and the egress API always need the token. Refusals wrap ErrAccessDenied (401).
func (s *Server) admitProxy(r *http.Request, id string, port int, sb proxySandbox) error {
	key := r.Header.Get("OPEN-SANDBOX-API-KEY")
	if s.cfg.APIKey != "" && secretEqual(key, s.cfg.APIKey) || s.cfg.GatewayKey != "" && secretEqual(key, s.cfg.GatewayKey) {
		return nil
	}
	tok, present := r.Header[http.CanonicalHeaderKey(AirlockAccessTokenHeader)]
	if !present {
		tok, present = r.Header[http.CanonicalHeaderKey(AccessTokenHeader)]
	}
	if present && sb.found {
		if len(tok) > 0 && sb.token != "" && secretEqual(tok[0], sb.token) {
			return nil
		}
		return fmt.Errorf("%w: the access token does not match sandbox %s", ErrAccessDenied, id)
	}
	if s.cfg.APIKey == "" && (!sb.found || s.portMode(sb.secure, port) == watch.Public) {
		return nil
	}
	return fmt.Errorf("%w: port %d of sandbox %s needs its access token (%s, as GET /sandboxes/%s/endpoints/%d gives in headers) or OPEN-SANDBOX-API-KEY",
		ErrAccessDenied, port, id, AccessTokenHeader, id, port)
}

// secretEqual compares two secrets in constant time (of their SHA-256, so the length of
// the expected one does not leak either).
func secretEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// auditIngress records a server proxy refusal (source ingress): who, which sandbox and
// port, why; never the credential.
func (s *Server) auditIngress(r *http.Request, id string, port int, mode watch.AccessMode, err error) {
	if s.cfg.Audit == nil {
		return
	}
	_, body, _ := httpError(err)
	s.cfg.Audit.Append(audit.Record{
		Time: time.Now().UTC(), SandboxID: id, Source: audit.SourceIngress, Proto: "http",
		Src: r.RemoteAddr, DstHost: r.Host, DstPort: port, Action: "deny", Reason: body.Message,
		Rule: "access:" + string(mode),
		Extra: map[string]any{
			"route": "server_proxy", "status": http.StatusUnauthorized,
			"request_id": r.Header.Get("X-Request-ID"), "method": r.Method,
		},
	})
}
