package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlockdev/airlock/gateway"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/stack"
)

// gatewayFlags are the flags of `airlock gateway`: they fill a stack.GatewayConfig, the
// configuration airlock up builds its gateway from, and show its defaults.
type gatewayFlags struct {
	cfg                       stack.GatewayConfig
	watchHeaders, signingKeys []string
	execdKey                  string
	logLevel                  string
}

func newGatewayCmd() *cobra.Command { return gatewayCommand(&gatewayFlags{}) }

func gatewayCommand(gf *gatewayFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the ingress gateway alone (embedded Caddy with the airlock modules)",
		Long: `Runs Airlock's ingress gateway: an embedded Caddy with the airlock app and handler. It
follows lifecycle's watch stream for the route table and proxies each request to the
sandbox port it names:

  host     <port>-<id>.<base domain>  or  <id>-<port>.<base domain>
  header   OpenSandbox-Ingress-To: <id>-<port>   (or X-Airlock-Sandbox + X-Airlock-Port)
  path     /sandboxes/<id>/proxy/<port>/...  or  /<id>/<port>/...

Signed routes (<port>-<id>-<expiry>-<tag>) are verified with the signing keys that
lifecycle mints with. Use this command to run the gateway as its own process (one
Deployment on Kubernetes); 'airlock up' runs the same gateway, built by the same code
with the same defaults, inside the all-in-one process: --listen is airlock.yaml's
gateway.listen, --base-domain gateway.routeDomains, --max-conns-per-sandbox,
--tls and --admin-listen likewise. A stock Caddy can load the same modules instead (see
gateway/README.md).

Every request decision goes to the hash-chained audit log in --audit-dir, as in
'airlock up': every checkpoint is signed with an Ed25519 key, <audit-dir>.key beside the
directory unless --audit-signing-key names one, generated with its public key
<audit-dir>.pub at the first start. 'airlock audit verify <audit-dir>' checks the chain
and the signatures. Each gateway replica needs a directory of its own.

Secrets can come from the environment: OPEN_SANDBOX_API_KEY (--api-key, sent to
lifecycle for the watch and renew intents, and admitted like a sandbox's access token
on execd 44772, the egress API 18080 and other token ports unless --refuse-api-key)
and AIRLOCK_SIGNING_KEYS (comma-separated --signing-key values). A gateway that faces
the internet should run with --refuse-api-key (the Kubernetes manifests do): the key
administers every sandbox and has no business at a public entry.`,
		Example: `  airlock gateway --watch-url http://127.0.0.1:8080/internal/v1/watch \
      --signing-key a=base64:$(head -c32 /dev/urandom | base64) \
      --renew-url 'http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration' \
      --audit-dir /var/lib/airlock/gateway-audit
  curl -H 'OpenSandbox-Ingress-To: <id>-8080' http://127.0.0.1:8081/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := gf.config()
			if err != nil {
				return err
			}
			cfg.Log = newLogger(gf.logLevel)
			g, err := stack.NewGateway(cfg)
			if err != nil {
				return err
			}
			if err := g.Start(); err != nil {
				return errors.Join(err, g.Close())
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "==> gateway listening on %s (base domains %s)\n", g.Addr(), strings.Join(cfg.RouteDomains, ", "))
			if cfg.TLS == string(gateway.TLSInternal) {
				fmt.Fprintf(out, "==> internal CA root certificate: %s\n", g.RootCertPath())
			}
			if cfg.Audit.Dir != "" {
				_, pub := cfg.Audit.KeyFiles()
				fmt.Fprintf(out, "==> audit log %s, checkpoints signed (public key %s)\n", cfg.Audit.Dir, pub)
			}
			if cfg.MetricsListen != "" {
				fmt.Fprintf(out, "==> metrics on http://%s/metrics\n", cfg.MetricsListen)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			fmt.Fprintln(out, "==> gateway stopping")
			return g.Close()
		},
	}
	gf.register(cmd.Flags())
	return cmd
}

// register adds the flags, each defaulting to stack.DefaultGatewayConfig's value.
func (gf *gatewayFlags) register(f *pflag.FlagSet) {
	gf.cfg = stack.DefaultGatewayConfig()
	c := &gf.cfg
	f.StringVar(&c.Listen, "listen", c.Listen, "address to serve on; airlock.yaml gateway.listen")
	f.StringSliceVar(&c.RouteDomains, "base-domain", c.RouteDomains, "base domain for host-form routes (repeatable; \"\" disables host routing); airlock.yaml gateway.routeDomains")
	f.StringVar(&c.WatchURL, "watch-url", c.WatchURL, "lifecycle watch stream URL, e.g. http://127.0.0.1:8080/internal/v1/watch")
	f.StringVar(&c.WatchFallbackURL, "watch-fallback-url", c.WatchFallbackURL, "watch stream followed while --watch-url cannot be reached, 30 s at a time (Kubernetes: --watch-url is the leading lifecycle replica's Service, this every replica's)")
	f.StringArrayVar(&gf.watchHeaders, "watch-header", nil, "extra header for the watch stream, \"Name: value\" (repeatable)")
	f.StringVar(&c.APIKey, "api-key", c.APIKey, "lifecycle API key sent as OPEN-SANDBOX-API-KEY to the watch and renew endpoints and accepted from clients on token ports (default $OPEN_SANDBOX_API_KEY)")
	f.StringArrayVar(&gf.signingKeys, "signing-key", nil, "signed-route key <id>=base64:<secret> or <id>=hex:<secret>, id one of [0-9a-z] (repeatable; default $AIRLOCK_SIGNING_KEYS)")
	f.StringVar(&gf.execdKey, "execd-key", "", "lifecycle's execd key, base64:<secret> or hex:<secret>: the gateway derives each sandbox's execd token from it, sends it to port 44772 and accepts it in X-EXECD-ACCESS-TOKEN (default $AIRLOCK_EXECD_KEY, else derived from the API key as airlock lifecycle does)")
	f.StringVar(&c.ActiveKey, "active-key", c.ActiveKey, "id of the key that mints (default: the first)")
	f.IntVar(&c.MaxConnsPerSandbox, "max-conns-per-sandbox", c.MaxConnsPerSandbox, "requests and streams in flight per sandbox (negative: no cap); airlock.yaml gateway.maxConnsPerSandbox")
	f.StringVar(&c.KeysURL, "keys-url", c.KeysURL, "lifecycle's key lookup, e.g. http://127.0.0.1:8080/v1/keys/self: other API keys are admitted on token ports by their principal's role (admin and operator: every sandbox; user: its own; auditor: none); empty: only --api-key")
	f.StringVar(&c.RenewURL, "renew-url", c.RenewURL, "renew-on-access endpoint with {id}, e.g. http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration (empty: off)")
	f.StringVar(&c.EgressAPI, "egress-api", c.EgressAPI, "lifecycle host:port that answers sandbox port 18080 (the OpenSandbox egress API /policy), e.g. 127.0.0.1:8080 (empty: port 18080 is proxied to the sandbox)")
	f.IntVar(&c.NodeEgressdPort, "node-egressd-port", c.NodeEgressdPort, "port of each node's egressd node API (its --metrics-listen; Kubernetes): the egressd of a sandbox pod's node watches for the process group of each execd command, which its record then names (0: off)")
	f.StringVar(&c.TLS, "tls", c.TLS, "TLS mode: \"\" (plain HTTP and h2c) or \"internal\" (local CA for *.<base domain>); airlock.yaml gateway.tls")
	f.StringVar(&c.DataDir, "data-dir", c.DataDir, "Caddy storage for certificates and the internal CA (default Caddy's data dir)")
	f.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "serve Prometheus /metrics on this address (empty: off)")
	registerAuditFlags(f, &c.Audit)
	registerAgentActionFlags(f, &c.Audit)
	f.BoolVar(&c.RefuseAPIKey, "refuse-api-key", c.RefuseAPIKey, "do not admit the API key from clients on token ports (only the sandbox's tokens or a signed URL); the key is still sent to lifecycle; airlock.yaml gateway.refuseAPIKey")
	f.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "enable Caddy's admin API on this address (empty: off); airlock.yaml gateway.adminListen")
	f.StringVar(&gf.logLevel, "log-level", "info", "log level: debug, info, warn, error")
}

// config is the configuration the flags give, with the environment's fallbacks
// ($OPEN_SANDBOX_API_KEY, $AIRLOCK_SIGNING_KEYS), resolved and checked.
func (gf *gatewayFlags) config() (stack.GatewayConfig, error) {
	c := gf.cfg
	if c.APIKey == "" {
		c.APIKey = os.Getenv("OPEN_SANDBOX_API_KEY")
	}
	if len(gf.watchHeaders) > 0 {
		var err error
		if c.WatchHeader, err = parseHeaders(gf.watchHeaders); err != nil {
			return c, err
		}
	}
	specs := gf.signingKeys
	if len(specs) == 0 {
		specs = envList("AIRLOCK_SIGNING_KEYS")
	}
	for _, s := range specs {
		k, err := signedurl.ParseKey(strings.TrimSpace(s))
		if err != nil {
			return c, err
		}
		c.SigningKeys = append(c.SigningKeys, k)
	}
	if k := cmp.Or(gf.execdKey, os.Getenv("AIRLOCK_EXECD_KEY")); k != "" {
		var err error
		if c.ExecdKey, err = execdtoken.ParseKey(k); err != nil {
			return c, err
		}
	} else {
		c.ExecdKey = execdtoken.FromAPIKey(c.APIKey) // as airlock lifecycle does
	}
	return c.Resolved()
}
