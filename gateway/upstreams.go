package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/airlockdev/airlock/gateway/route"
	"github.com/airlockdev/airlock/opensandbox"
)

func init() {
	caddy.RegisterModule(Upstreams{})
	caddy.RegisterModule(Permission{})
}

// Upstreams is the reverse_proxy dynamic upstream source http.reverse_proxy.upstreams.airlock:
// it returns the one upstream the airlock handler decided for this request (the request
// variable airlock.dial), so a single reverse_proxy, with one pooled transport, serves
// every sandbox. Without a decision it fails and reverse_proxy answers 502/503.
//
// Caddyfile: `reverse_proxy { dynamic airlock }` after an `airlock route_only` handler.
type Upstreams struct{}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.reverse_proxy.upstreams.airlock", New: func() caddy.Module { return new(Upstreams) }}
}

// GetUpstreams returns the decided upstream; it performs no I/O.
func (Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	dial, _ := caddyhttp.GetVar(r.Context(), VarDial).(string)
	if dial == "" {
		return nil, errNoRouteInRequest
	}
	return []*reverseproxy.Upstream{{Dial: dial}}, nil
}

// UnmarshalCaddyfile sets up the source from Caddyfile tokens. Syntax:
//
//	dynamic airlock
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "airlock"
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Permission is the on-demand TLS permission module tls.permission.airlock: a certificate
// may be obtained for a host only when it is "<label>.<base domain>", the label names a
// sandbox in the route table (of any state), and the sandbox has fewer than the app's
// MaxCertificatesPerSandbox distinct hosts allowed so far. A signed label
// ("<port>-<id>-<exp>-<tag>") gets none unless the app sets SignedHostCertificates, and
// then only with a valid, unexpired tag under the sandbox's current epoch, never for a
// control port: every certificate is published in Certificate Transparency logs, so a
// signed host that gets one is public. It performs no I/O.
//
// Caddyfile (global options): `on_demand_tls { permission airlock }`.
type Permission struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Permission) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "tls.permission.airlock", New: func() caddy.Module { return new(Permission) }}
}

// Provision binds the module to the airlock app.
func (p *Permission) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("airlock")
	if err != nil {
		return fmt.Errorf("airlock permission: %w", err)
	}
	p.app = appIface.(*App)
	return nil
}

// CertificateAllowed returns nil when a certificate may be obtained for name (see
// Permission) and counts the answer in airlock_gateway_certificate_permissions_total.
func (p *Permission) CertificateAllowed(_ context.Context, name string) error {
	res, err := p.app.certificateAllowed(name, time.Now())
	p.app.metrics.certs.WithLabelValues(res).Inc()
	if err != nil {
		p.app.log.Debug("on-demand certificate refused", "host", name, "result", res, "err", err)
	}
	return err
}

// Results of the on-demand certificate permission, the label values of
// airlock_gateway_certificate_permissions_total.
const (
	certAllowed        = "allowed"
	certNotSandboxHost = "not_sandbox_host"
	certUnknownSandbox = "unknown_sandbox"
	certSignedHost     = "signed_host"
	certControlPort    = "control_port"
	certBadSignature   = "bad_signature"
	certOverCap        = "over_cap"
)

var certResults = []string{certAllowed, certNotSandboxHost, certUnknownSandbox, certSignedHost, certControlPort, certBadSignature, certOverCap}

// certificateAllowed decides whether on-demand TLS may obtain a certificate for name at
// now; it returns the result label and, for a refusal, the reason.
func (a *App) certificateAllowed(name string, now time.Time) (string, error) {
	var buf [route.MaxCandidates]route.Candidate
	host := strings.ToLower(name)
	isSandboxHost := false
	for _, d := range a.domains {
		if strings.HasSuffix(host, "."+d) {
			isSandboxHost = true
			break
		}
	}
	if !isSandboxHost {
		return certNotSandboxHost, fmt.Errorf("%s is not under an airlock base domain", name)
	}
	cands, err := route.Parse(route.Input{Host: host}, a.domains, buf[:0])
	if err != nil {
		return certNotSandboxHost, fmt.Errorf("%s: %w", name, err)
	}
	for _, c := range cands {
		e, ok := a.table.Lookup(c.ID)
		if !ok {
			continue
		}
		if c.Signed {
			switch {
			case !a.SignedHostCertificates:
				return certSignedHost, fmt.Errorf("%s is a signed host label: no certificate (it would publish the credential); use the signed path form or a wildcard certificate", name)
			case opensandbox.IsControlPort(c.Port):
				return certControlPort, fmt.Errorf("%s is a signed host label for control port %d", name, c.Port)
			}
			sb, _ := e.View()
			if err := a.keys.VerifyEpoch(c.ID, c.Port, c.ExpiresB36, c.Tag, sb.Access.SignedEpoch, now); err != nil {
				return certBadSignature, fmt.Errorf("%s: %w", name, err)
			}
		}
		if !a.certs.admit(c.ID, host) {
			return certOverCap, fmt.Errorf("%s: sandbox %s already has %d certificate hosts (max_certificates_per_sandbox)", name, c.ID, a.certs.max)
		}
		return certAllowed, nil
	}
	return certUnknownSandbox, fmt.Errorf("%s names no sandbox in the route table", name)
}

// certHosts caps the distinct hosts on-demand TLS may obtain certificates for, per
// sandbox, for the app's lifetime; forget drops a deleted sandbox's hosts. Safe for
// concurrent use; no I/O.
type certHosts struct {
	max   int // 0: no cap
	mu    sync.Mutex
	hosts map[string]map[string]struct{} // sandbox id -> hosts allowed
}

// admit reports whether host may have a certificate for sandbox id: a host allowed
// before always may, a new one while the sandbox is under the cap.
func (c *certHosts) admit(id, host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.hosts[id]
	if _, ok := set[host]; ok {
		return true
	}
	if c.max > 0 && len(set) >= c.max {
		return false
	}
	if set == nil {
		if c.hosts == nil {
			c.hosts = map[string]map[string]struct{}{}
		}
		set = map[string]struct{}{}
		c.hosts[id] = set
	}
	set[host] = struct{}{}
	return true
}

func (c *certHosts) forget(id string) {
	c.mu.Lock()
	delete(c.hosts, id)
	c.mu.Unlock()
}

// UnmarshalCaddyfile: `permission airlock` takes no arguments.
func (p *Permission) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Interface guards.
var (
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
	_ caddytls.OnDemandPermission = (*Permission)(nil)
	_ caddy.Provisioner           = (*Permission)(nil)
	_ caddyfile.Unmarshaler       = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler       = (*Permission)(nil)
)
