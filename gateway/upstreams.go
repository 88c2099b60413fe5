package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/airlockdev/airlock/gateway/route"
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
// may be obtained for a host only when it is "<label>.<base domain>" and the label names a
// sandbox in the route table (of any state). Lookups never perform I/O.
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

// CertificateAllowed returns nil when name is a sandbox host in the route table.
func (p *Permission) CertificateAllowed(_ context.Context, name string) error {
	var buf [route.MaxCandidates]route.Candidate
	host := strings.ToLower(name)
	isSandboxHost := false
	for _, d := range p.app.domains {
		if strings.HasSuffix(host, "."+d) {
			isSandboxHost = true
			break
		}
	}
	if !isSandboxHost {
		return fmt.Errorf("%s is not under an airlock base domain", name)
	}
	cands, err := route.Parse(route.Input{Host: host}, p.app.domains, buf[:0])
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for _, c := range cands {
		if _, ok := p.app.table.Lookup(c.ID); ok {
			return nil
		}
	}
	return fmt.Errorf("%s names no sandbox in the route table", name)
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
