package lifecycle

import (
	"fmt"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// EndpointRequest is one GET /sandboxes/{id}/endpoints/{port}.
type EndpointRequest struct {
	// HTTP is the request; its Host is the address the client used.
	HTTP *http.Request
	ID   string
	Port int
	// ServerProxy is use_server_proxy=true.
	ServerProxy bool
	// Expires is set for a signed endpoint (?expires=<Unix seconds>, OSEP-0011); never
	// together with ServerProxy. It is at most Config.MaxSignedURLLifetime from now.
	Expires *time.Time
	// SignedEpoch is the sandbox's signed-URL epoch, which the signature of a signed
	// endpoint must cover (signedurl.Keyring.MintEpoch); Server.Endpoint sets it.
	SignedEpoch uint64
}

// DefaultMaxSignedURLLifetime is the default of Config.MaxSignedURLLifetime.
const DefaultMaxSignedURLLifetime = 24 * time.Hour

// EndpointFunc returns the endpoint (host[:port][/path], no scheme) for er. Errors
// wrapping the package's sentinels reach the client with their status.
type EndpointFunc func(er EndpointRequest) (string, error)

// ServerProxyEndpoint is the default endpoint: host/sandboxes/{id}/proxy/{port} on this
// server, served by its proxy.
func ServerProxyEndpoint(host, id string, port int) string {
	return fmt.Sprintf("%s/sandboxes/%s/proxy/%d", host, id, port)
}

// Endpoint answers where a client reaches a port of a sandbox (GET
// /sandboxes/{id}/endpoints/{port}): the configured EndpointFunc, or this server's
// proxy. For a token port (execd, the egress API, any port of a secureAccess sandbox or
// under DefaultAccess token) Headers carries the access token under AccessTokenHeader;
// the endpoint of execd's port adds the sandbox's execd token under ExecdTokenHeader;
// a signed endpoint carries its own credential and no headers. Signed endpoints
// (Expires) need an EndpointFunc that mints them (the gateway's): without one they are
// 501.
func (s *Server) Endpoint(er EndpointRequest) (Endpoint, error) {
	s.mu.Lock()
	e, ok := s.sbx[er.ID]
	var token string
	var state opensandbox.State
	var secure bool
	if ok {
		token, state, secure = e.rec.AccessToken, e.rec.Status.State, e.rec.secure()
		er.SignedEpoch = e.rec.SignedURLEpoch
	}
	s.mu.Unlock()
	if !ok {
		return Endpoint{}, fmt.Errorf("%w: %q", ErrNotFound, er.ID)
	}
	if state.Terminal() {
		return Endpoint{}, fmt.Errorf("%w: sandbox %s is %s", ErrInvalidState, er.ID, state)
	}
	var ep Endpoint
	switch {
	case s.cfg.Endpoint != nil:
		addr, err := s.cfg.Endpoint(er)
		if err != nil {
			return Endpoint{}, err
		}
		ep.Endpoint = addr
	case er.Expires != nil:
		return Endpoint{}, fmt.Errorf("%w: signed endpoints (expires) need the Airlock gateway", ErrNotImplemented)
	default:
		host := s.cfg.PublicAddr
		if host == "" {
			host = er.HTTP.Host
		}
		ep.Endpoint = ServerProxyEndpoint(host, er.ID, er.Port)
	}
	if token != "" && er.Expires == nil && s.rules.portMode(secure, er.Port) == watch.Token {
		ep.Headers = map[string]string{AccessTokenHeader: token}
		if er.Port == s.cfg.ExecdPort {
			// OpenSandbox's execd clients send only this one (NewExecdClient(endpoint,
			// headers["X-EXECD-ACCESS-TOKEN"])): the gateway and the server proxy accept
			// it for this port of this sandbox.
			ep.Headers[ExecdTokenHeader] = s.cfg.ExecdKey.Derive(er.ID)
		}
	}
	return ep, nil
}

// RevokeSignedURLs makes every signed URL minted so far for sandbox id stop working: it
// increments the sandbox's signed-URL epoch, which the gateway learns from the watch
// stream (a URL is refused with 401 from then on, within the watch latency). Signed URLs
// minted afterwards work. It returns the new epoch; ErrNotFound for an unknown sandbox,
// ErrInvalidState for a terminated one.
func (s *Server) RevokeSignedURLs(id string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	if rec.Status.State.Terminal() {
		return 0, fmt.Errorf("%w: sandbox %s is %s", ErrInvalidState, id, rec.Status.State)
	}
	rec.SignedURLEpoch++
	if err := s.commitLocked(rec); err != nil {
		rec.SignedURLEpoch--
		return 0, err
	}
	s.log.Info("signed urls revoked", "sandbox_id", id, "signed_url_epoch", rec.SignedURLEpoch)
	return rec.SignedURLEpoch, nil
}

// RevokeSignedURLsResponse is the body of POST /sandboxes/{id}/signed-urls/revoke.
type RevokeSignedURLsResponse struct {
	// SignedURLEpoch is the sandbox's new signed-URL epoch.
	SignedURLEpoch uint64 `json:"signedUrlEpoch"`
}

// handleRevokeSignedURLs serves POST /sandboxes/{id}/signed-urls/revoke (an Airlock
// extension; the API key is required like on every lifecycle route).
func (s *Server) handleRevokeSignedURLs(w http.ResponseWriter, r *http.Request) {
	epoch, err := s.RevokeSignedURLs(r.PathValue("id"))
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, RevokeSignedURLsResponse{SignedURLEpoch: epoch})
}
