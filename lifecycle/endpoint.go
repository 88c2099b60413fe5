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
	// together with ServerProxy.
	Expires *time.Time
}

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
