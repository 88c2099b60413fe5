package stack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle"
)

// startAudit opens the audit log every component writes to (StateDir/audit by default).
func (s *Stack) startAudit(context.Context) error {
	w, err := audit.New(audit.Config{
		Dir:      s.cfg.Audit.Dir,
		Logger:   s.log.With("component", "audit"),
		Registry: s.registry,
	})
	if err != nil {
		return err
	}
	s.Audit = w
	return nil
}

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
// listener, following lifecycle's watch stream over loopback with the API key.
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
	hdr := http.Header{}
	var keySum string // the gateway admits the API key by its SHA-256 only
	if s.APIKey != "" {
		hdr.Set("OPEN-SANDBOX-API-KEY", s.APIKey)
		keySum = accesstoken.Sum(s.APIKey).String()
	}
	g := s.cfg.Gateway
	srv, err := gateway.NewServer(gateway.Config{
		Listen:             g.Listen,
		BaseDomains:        g.RouteDomains,
		WatchURL:           api + "/internal/v1/watch",
		WatchHeader:        hdr,
		SigningKeys:        []signedurl.Key{key},
		APIKeySHA256:       keySum,
		MaxConnsPerSandbox: g.MaxConnsPerSandbox,
		RenewURL:           api + "/v1/sandboxes/{id}/renew-expiration",
		RenewHeader:        hdr,
		EgressAPIDial:      loopbackAddr(s.Addr),
		EgressAPIHeader:    http.Header{"Open-Sandbox-Api-Key": {s.gatewayKey}},
		TLS:                gateway.TLSMode(g.TLS),
		DataDir:            filepath.Join(s.cfg.StateDir, "caddy"),
		Audit:              s.Audit,
		Metrics:            s.registry,
		Log:                s.log.With("component", "gateway"),
	})
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	s.Gateway = srv
	public := g.PublicAddr
	if public == "" {
		public = srv.Addr()
	}
	s.endpoints.Store(&signedurl.Endpoints{Gateway: public, BaseDomain: g.BaseDomain, Keys: kr})
	return nil
}

// endpoint is lifecycle's EndpointFunc: through the gateway once it runs (path form, or
// host form under gateway.baseDomain), lifecycle's own server proxy before that or when
// the gateway is disabled.
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
	ep, err := e.For(er.ID, er.Port, er.ServerProxy, er.Expires)
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

// AuditDir is the directory of the audit log.
func (s *Stack) AuditDir() string { return s.cfg.Audit.Dir }
