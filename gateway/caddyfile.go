package gateway

import (
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("airlock", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("airlock", parseHandlerDirective)
	httpcaddyfile.RegisterDirectiveOrder("airlock", httpcaddyfile.Before, "reverse_proxy")
}

// UnmarshalCaddyfile sets up the app from the global option block. Syntax:
//
//	airlock {
//		watch <url> {
//			header <name> <value>
//			max_backoff <duration>
//		}
//		base_domains <domain...>
//		signing_key <id> <base64:…|hex:…>
//		active_key <id>
//		api_key <lifecycle API key>          # or: api_key_sha256 <64 hex digits>
//		max_conns_per_sandbox <n>
//		renew <url with {id}> {
//			header <name> <value>
//			interval <duration>
//			timeout <duration>
//		}
//		tombstone_ttl <duration>
//		max_certificates_per_sandbox <n>     # on-demand TLS hosts per sandbox; default 16
//		signed_host_certificates             # on-demand TLS for verified signed host labels
//		egress_api <lifecycle host:port> {
//			header <name> <value>
//		}
//	}
//
// Values may use placeholders such as {env.AIRLOCK_API_KEY}.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "airlock"
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "watch":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.Watch = &WatchConfig{URL: d.Val()}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "header":
					if err := parseHeaderLine(d, &a.Watch.Headers); err != nil {
						return err
					}
				case "max_backoff":
					dur, err := parseDurationArg(d)
					if err != nil {
						return err
					}
					a.Watch.MaxBackoff = dur
				default:
					return d.Errf("unknown watch option %q", d.Val())
				}
			}
		case "base_domains":
			a.BaseDomains = append(a.BaseDomains, d.RemainingArgs()...)
			if len(a.BaseDomains) == 0 {
				return d.ArgErr()
			}
		case "signing_key":
			var k SigningKey
			if !d.Args(&k.ID, &k.Secret) || d.NextArg() {
				return d.ArgErr()
			}
			a.SigningKeys = append(a.SigningKeys, k)
		case "active_key":
			if !d.Args(&a.ActiveKey) || d.NextArg() {
				return d.ArgErr()
			}
		case "api_key":
			if !d.Args(&a.APIKey) || d.NextArg() {
				return d.ArgErr()
			}
		case "api_key_sha256":
			if !d.Args(&a.APIKeySHA256) || d.NextArg() {
				return d.ArgErr()
			}
		case "max_conns_per_sandbox":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil {
				return d.Errf("max_conns_per_sandbox %q: %v", d.Val(), err)
			}
			a.MaxConnsPerSandbox = n
		case "renew":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.Renew = &RenewConfig{URL: d.Val()}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				var err error
				switch d.Val() {
				case "header":
					err = parseHeaderLine(d, &a.Renew.Headers)
				case "interval":
					a.Renew.Interval, err = parseDurationArg(d)
				case "timeout":
					a.Renew.Timeout, err = parseDurationArg(d)
				default:
					err = d.Errf("unknown renew option %q", d.Val())
				}
				if err != nil {
					return err
				}
			}
		case "egress_api":
			if !d.NextArg() {
				return d.ArgErr()
			}
			a.EgressAPI = &EgressAPIConfig{Dial: d.Val()}
			if d.NextArg() {
				return d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if d.Val() != "header" {
					return d.Errf("unknown egress_api option %q", d.Val())
				}
				if err := parseHeaderLine(d, &a.EgressAPI.Headers); err != nil {
					return err
				}
			}
		case "max_certificates_per_sandbox":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || d.NextArg() {
				return d.Errf("max_certificates_per_sandbox %q: want one integer", d.Val())
			}
			a.MaxCertificatesPerSandbox = n
		case "signed_host_certificates":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.SignedHostCertificates = true
		case "tombstone_ttl":
			dur, err := parseDurationArg(d)
			if err != nil {
				return err
			}
			a.TombstoneTTL = dur
		default:
			return d.Errf("unknown airlock option %q", d.Val())
		}
	}
	return nil
}

func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "airlock", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	airlock [<base_domain...>] {
//		base_domains <domain...>
//		route_only
//		proxy {
//			<reverse_proxy subdirectives, without upstreams>
//		}
//	}
//
// Base domains given here override the app's. The proxy block takes every reverse_proxy
// subdirective (transport, header_up, flush_interval, stream_timeout, …); the upstreams
// are always the airlock dynamic source.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "airlock"
	h.BaseDomains = append(h.BaseDomains, d.RemainingArgs()...)
	for d.NextBlock(0) {
		switch d.Val() {
		case "base_domains":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			h.BaseDomains = append(h.BaseDomains, args...)
		case "route_only":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.RouteOnly = true
		case "proxy":
			rp := new(reverseproxy.Handler)
			if err := rp.UnmarshalCaddyfile(d.NewFromNextSegment()); err != nil {
				return err
			}
			if len(rp.Upstreams) > 0 || rp.DynamicUpstreamsRaw != nil {
				return d.Err("the airlock proxy block takes no upstreams: they come from the route table")
			}
			h.Proxy = rp
		default:
			return d.Errf("unknown airlock handler option %q", d.Val())
		}
	}
	return nil
}

func parseHandlerDirective(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(helper.Dispenser); err != nil {
		return nil, err
	}
	if h.Proxy != nil {
		if err := h.Proxy.FinalizeUnmarshalCaddyfile(helper); err != nil {
			return nil, err
		}
	}
	return h, nil
}

func parseHeaderLine(d *caddyfile.Dispenser, h *http.Header) error {
	var name, value string
	if !d.Args(&name, &value) || d.NextArg() {
		return d.ArgErr()
	}
	if *h == nil {
		*h = make(http.Header)
	}
	h.Add(name, value)
	return nil
}

func parseDurationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return 0, d.Errf("duration %q: %v", d.Val(), err)
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return caddy.Duration(dur), nil
}

// Interface guards.
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
