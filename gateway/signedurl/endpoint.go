package signedurl

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Endpoints builds the endpoint strings lifecycle returns from
// GET /sandboxes/{id}/endpoints/{port} (OpenSandbox lifecycle spec, Endpoint schema):
// host[:port][/path] with no scheme, pointing through the gateway.
type Endpoints struct {
	// Gateway is the host[:port] clients use to reach the gateway, for example
	// "127.0.0.1:8081". A port of 80 or 443 is left out of host-form endpoints.
	Gateway string
	// BaseDomain, when set, selects host-form endpoints "<port>-<id>.<BaseDomain>[:port]";
	// when empty, endpoints use the path form "<Gateway>/sandboxes/<id>/proxy/<port>".
	BaseDomain string
	// Keys mints signed endpoints; nil means Signed fails with ErrInvalidKey.
	Keys *Keyring
	// PathPorts, when set, names the ports whose unsigned endpoints keep the
	// path form even with BaseDomain set. airlock up passes opensandbox.IsControlPort:
	// execd and the egress API are used by SDK clients, whose resolvers (Node, Go, glibc)
	// may not resolve *.localhost names, and are never browsed.
	PathPorts func(port int) bool
}

// hostFormFor reports whether port's endpoints use the host form.
func (e Endpoints) hostFormFor(port int) bool {
	return e.BaseDomain != "" && (e.PathPorts == nil || !e.PathPorts(port))
}

// Endpoint returns the unsigned endpoint of port of sandbox id. Host form needs an id
// that is a valid host label part (HostSafeID) and a port not in PathPorts; others get
// the path form.
func (e Endpoints) Endpoint(id string, port int) string {
	if e.hostFormFor(port) && HostSafeID(id) {
		if l := strconv.Itoa(port) + "-" + id; len(l) <= MaxLabelLen {
			return e.hostForm(l)
		}
	}
	return e.ServerProxy(id, port)
}

// ServerProxy returns the path-form endpoint "<Gateway>/sandboxes/<id>/proxy/<port>", the
// shape OpenSandbox clients expect with use_server_proxy=true.
func (e Endpoints) ServerProxy(id string, port int) string {
	return strings.TrimSuffix(e.Gateway, "/") + "/sandboxes/" + id + "/proxy/" + strconv.Itoa(port)
}

// Signed returns a signed endpoint of port of sandbox id valid until expires, under the
// sandbox's signed-URL epoch: always the path form "<Gateway>/<id>/<port>/<exp>/<tag>",
// whatever BaseDomain says. A signed host label would be a credential in the TLS server
// name: with on-demand TLS every such host gets a certificate, published in Certificate
// Transparency logs where anyone can read it; in a path it stays inside TLS.
func (e Endpoints) Signed(id string, port int, expires time.Time, epoch uint64) (string, error) {
	if e.Keys == nil {
		return "", fmt.Errorf("%w: no signing keys configured", ErrInvalidKey)
	}
	r, err := e.Keys.MintEpoch(id, port, expires, epoch)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(e.Gateway, "/") + r.Path(), nil
}

// For returns the endpoint lifecycle answers GET /sandboxes/{id}/endpoints/{port}
// with: Signed (under epoch) when expires is set (OSEP-0011), the path form when
// serverProxy (use_server_proxy=true), Endpoint otherwise. Only Signed fails.
func (e Endpoints) For(id string, port int, serverProxy bool, expires *time.Time, epoch uint64) (string, error) {
	switch {
	case expires != nil:
		return e.Signed(id, port, *expires, epoch)
	case serverProxy:
		return e.ServerProxy(id, port), nil
	default:
		return e.Endpoint(id, port), nil
	}
}

func (e Endpoints) hostForm(label string) string {
	host := label + "." + strings.TrimPrefix(e.BaseDomain, ".")
	if _, port, err := net.SplitHostPort(e.Gateway); err == nil && port != "80" && port != "443" && port != "" {
		return net.JoinHostPort(host, port)
	}
	return host
}
