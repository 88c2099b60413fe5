package stack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// signingKey returns the signed-route key: the configured one, the stored one
// (StateDir/signing-key) or a new random one it stores. Its shape is signedurl.ParseKey's
// "<id>=base64:<secret>".
func (s *Stack) signingKey() (signedurl.Key, error) {
	spec := s.cfg.Gateway.SigningKey
	if spec == "" {
		p := filepath.Join(s.cfg.StateDir, "signing-key")
		b, err := os.ReadFile(p)
		switch {
		case err == nil:
			spec = strings.TrimSpace(string(b))
		case errors.Is(err, os.ErrNotExist):
			var r [32]byte
			if _, err := rand.Read(r[:]); err != nil {
				return signedurl.Key{}, err
			}
			spec = "a=base64:" + base64.StdEncoding.EncodeToString(r[:])
			if err := os.WriteFile(p, []byte(spec+"\n"), 0o600); err != nil {
				return signedurl.Key{}, fmt.Errorf("storing the signing key: %w", err)
			}
		default:
			return signedurl.Key{}, fmt.Errorf("reading the signing key: %w", err)
		}
	}
	k, err := signedurl.ParseKey(spec)
	if err != nil {
		return signedurl.Key{}, fmt.Errorf("gateway signing key: %w", err)
	}
	return k, nil
}

// startGateway runs the embedded gateway (Caddy with the airlock app) after the API
// listener, following lifecycle's watch stream over loopback with the API key, and
// writing to the stack's audit log.
func (s *Stack) startGateway(context.Context) error {
	key, err := s.signingKey()
	if err != nil {
		return err
	}
	kr, err := signedurl.NewKeyring(key.ID, key)
	if err != nil {
		return err
	}
	api := "http://" + loopbackAddr(s.Addr)
	g := s.cfg.Gateway
	g.WatchURL = api + "/internal/v1/watch"
	g.APIKey = s.APIKey
	g.SigningKeys = []signedurl.Key{key}
	g.ExecdKey = s.execdKey
	g.RenewURL = api + "/v1/sandboxes/{id}/renew-expiration"
	g.KeysURL = api + "/v1/keys/self"
	g.EgressAPI, g.EgressAPIKey = loopbackAddr(s.Addr), s.gatewayKey
	g.DataDir = filepath.Join(s.cfg.StateDir, "caddy")
	g.AuditWriter, g.Registry, g.Log = s.Audit, s.registry, s.log.With("component", "gateway")
	g.Audit.AgentActions = s.cfg.Audit.AgentActions
	srv, err := NewGateway(g)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return errors.Join(err, srv.Close())
	}
	s.Gateway = srv
	public := g.PublicAddr
	if public == "" {
		public = srv.Addr()
	}
	s.endpoints.Store(&signedurl.Endpoints{Gateway: public, BaseDomain: endpointDomain(g), Keys: kr,
		PathPorts: opensandbox.IsControlPort})
	return nil
}

// endpointDomain is the base domain of host-form endpoints: gateway.baseDomain, else the
// first of gateway.routeDomains (airlock.localhost by default, which browsers resolve to
// loopback themselves); "" (path form) when host routing is off.
func endpointDomain(g GatewayConfig) string {
	if g.BaseDomain != "" {
		return g.BaseDomain
	}
	if len(g.RouteDomains) > 0 {
		return g.RouteDomains[0]
	}
	return ""
}

// endpoint is lifecycle's EndpointFunc: through the gateway once it runs, lifecycle's own
// server proxy before that or when the gateway is disabled. Through the gateway, user
// ports get the host form "<port>-<id>.<domain>" (an origin per sandbox port, for
// browsers); execd and the egress API (opensandbox.IsControlPort) and requests with
// use_server_proxy=true get the path form "<gateway>/sandboxes/<id>/proxy/<port>", which
// SDK clients reach without resolving *.localhost names.
func (s *Stack) endpoint(er lifecycle.EndpointRequest) (string, error) {
	e := s.endpoints.Load()
	if e == nil {
		if er.Expires != nil {
			return "", fmt.Errorf("%w: signed endpoints need the gateway", lifecycle.ErrInvalidRequest)
		}
		host := s.cfg.PublicAddr
		if host == "" {
			host = er.HTTP.Host
		}
		return lifecycle.ServerProxyEndpoint(host, er.ID, er.Port), nil
	}
	ep, err := e.For(er.ID, er.Port, er.ServerProxy, er.Expires, er.SignedEpoch)
	if err != nil {
		return "", fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
	}
	return ep, nil
}

// loopbackAddr turns a wildcard listen address into a loopback one this process can dial.
func loopbackAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

func (s *Stack) stopGateway(context.Context) error {
	s.endpoints.Store(nil)
	return s.Gateway.Close()
}
