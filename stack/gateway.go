package stack

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/opensandbox"
)

// GatewayConfig configures the ingress gateway (package gateway, embedded Caddy)
// wherever it runs: the gateway section of airlock.yaml for `airlock up`, the flags of
// `airlock gateway`. A setting with a YAML key means the same on both paths (those
// marked "airlock up only" have no flag), and DefaultGatewayConfig holds every default
// (the flags of `airlock gateway` show them). The fields without a YAML key say where
// the gateway runs: airlock up sets them from its own API listener and state
// directory, the standalone command from its flags.
type GatewayConfig struct {
	// Disabled turns the gateway off in airlock up; endpoints then point at lifecycle's
	// server proxy.
	Disabled bool `yaml:"disabled"`
	// Listen is the gateway's address; default 127.0.0.1:8081 (gateway.DefaultListen).
	// Port 0 picks a free port.
	Listen string `yaml:"listen"`
	// PublicAddr is the host[:port] clients use to reach the gateway, written into
	// endpoints; default the bound listen address. airlock up only.
	PublicAddr string `yaml:"publicAddr"`
	// BaseDomain is the domain of host-form endpoints ("<port>-<id>.<baseDomain>",
	// one browser origin per sandbox port); it must resolve to the gateway (wildcard DNS),
	// and it is always one of RouteDomains. Empty (the default): the first of
	// RouteDomains, airlock.localhost unless configured (browsers and curl resolve
	// *.localhost to loopback themselves); no RouteDomains: path-form endpoints
	// ("<publicAddr>/sandboxes/<id>/proxy/<port>"). Execd (44772) and the egress API
	// (18080) always get the path form, as does any endpoint asked with
	// use_server_proxy=true: SDK clients reach it whatever their resolver (glibc and Node
	// do not resolve *.localhost names). airlock up only (on Kubernetes,
	// `airlock lifecycle --base-domain` mints endpoints).
	BaseDomain string `yaml:"baseDomain"`
	// RouteDomains are the base domains host-form requests are accepted under
	// (`airlock gateway --base-domain`); default [airlock.localhost] (browsers and curl
	// resolve *.localhost to loopback themselves). An empty list turns host-form
	// routing off.
	RouteDomains []string `yaml:"routeDomains"`
	// SigningKey signs endpoints minted with ?expires= ("<id>=base64:<secret>"); default
	// a random key generated once and stored in <stateDir>/signing-key. airlock up only:
	// a standalone gateway verifies with SigningKeys, lifecycle's keys.
	SigningKey string `yaml:"signingKey"`
	// DefaultAccess is who may reach sandbox ports other than execd (44772) and the
	// egress API (18080), which always need a credential: "public" (the default: anyone
	// who can reach the gateway) or "token" (the sandbox's access token, a signed URL or
	// the API key, as on the control ports). A sandbox created with secureAccess is token
	// on every port either way. It is lifecycle's setting (the watch stream carries it to
	// the gateway), and applies at lifecycle's server proxy too. airlock up only; on
	// Kubernetes, `airlock lifecycle --default-access`.
	DefaultAccess string `yaml:"defaultAccess"`
	// MaxConnsPerSandbox caps the requests and streams in flight per sandbox; default
	// 1024; negative: no cap.
	MaxConnsPerSandbox int `yaml:"maxConnsPerSandbox"`
	// TLS is "" (plain HTTP and h2c, the default) or "internal" (Caddy's local CA for
	// *.<route domain>).
	TLS string `yaml:"tls"`
	// AdminListen enables Caddy's admin API on this address; default empty: off.
	AdminListen string `yaml:"adminListen"`
	// RefuseAPIKey stops the gateway admitting lifecycle's API key
	// (OPEN-SANDBOX-API-KEY) from clients on token ports: only the sandbox's access
	// token, its execd token (44772) or a signed URL admit there, and a request with the
	// key alone gets 401. The key is still sent to lifecycle (watch, renew, egress API).
	// Default false: admitted, as on one host where the gateway listens on loopback. The
	// Kubernetes manifests set it (--refuse-api-key): a public gateway never takes the
	// key that administers every sandbox.
	RefuseAPIKey bool `yaml:"refuseAPIKey"`

	// WatchURL is lifecycle's watch stream (…/internal/v1/watch), followed with
	// WatchHeader and APIKey. Empty: no routes.
	WatchURL    string      `yaml:"-"`
	WatchHeader http.Header `yaml:"-"`
	// WatchFallbackURL is followed while WatchURL cannot be reached (Kubernetes: every
	// lifecycle replica's Service behind the leader's); empty: none.
	WatchFallbackURL string `yaml:"-"`
	// APIKey is lifecycle's API key: sent as OPEN-SANDBOX-API-KEY to the watch and
	// renew endpoints, and admitted from clients on token ports (the gateway keeps only
	// its SHA-256). Empty: none.
	APIKey string `yaml:"-"`
	// SigningKeys verify signed routes; ActiveKey names the minting one (default the
	// first). airlock up: its SigningKey.
	SigningKeys []signedurl.Key `yaml:"-"`
	// ExecdKey is lifecycle's execd key (gateway.App.ExecdKey): the gateway derives
	// every sandbox's execd token from it. airlock up: its own (<stateDir>/execd-key).
	ExecdKey  execdtoken.Key `yaml:"-"`
	ActiveKey string         `yaml:"-"`
	// RenewURL is lifecycle's renew-on-access endpoint with "{id}"; empty: off.
	RenewURL string `yaml:"-"`
	// KeysURL is lifecycle's GET /v1/keys/self: the gateway admits lifecycle's other
	// API keys by their principal's role (gateway.PrincipalKeysConfig), unless
	// RefuseAPIKey. Empty: only APIKey.
	KeysURL string `yaml:"-"`
	// EgressAPI is lifecycle's host:port that answers sandbox port 18080 (the
	// OpenSandbox egress API), sent EgressAPIKey (default APIKey) as
	// OPEN-SANDBOX-API-KEY; empty: port 18080 is proxied to the sandbox.
	EgressAPI    string `yaml:"-"`
	EgressAPIKey string `yaml:"-"`
	// NodeEgressdPort, when set, is the port of each node's egressd node API (its
	// --metrics-listen): the gateway asks the egressd of a pod's node for the process
	// groups of execd commands (gateway.NodeGroupsConfig, with APIKey). 0: off.
	NodeEgressdPort int `yaml:"-"`
	// DataDir is Caddy's storage (certificates, the internal CA); default Caddy's
	// ($XDG_DATA_HOME/caddy). airlock up: <stateDir>/caddy.
	DataDir string `yaml:"-"`
	// MetricsListen, when set, serves /metrics on this address. airlock up serves its
	// metrics on the API listener instead.
	MetricsListen string `yaml:"-"`
	// Audit is the audit log NewGateway opens when AuditWriter is nil (empty Dir: no
	// audit).
	Audit AuditConfig `yaml:"-"`

	// AuditWriter, when set, is the audit log to write to (airlock up's shared one); the
	// caller closes it.
	AuditWriter *audit.Writer `yaml:"-"`
	// Registry receives the metrics; nil: a new registry with the Go and process
	// collectors.
	Registry *prometheus.Registry `yaml:"-"`
	// Log is the gateway's logger; nil discards.
	Log *slog.Logger `yaml:"-"`
}

// DefaultGatewayConfig is every default of the gateway, for airlock.yaml and for the
// flags of `airlock gateway` alike.
func DefaultGatewayConfig() GatewayConfig {
	return GatewayConfig{
		Listen:             gateway.DefaultListen,
		RouteDomains:       []string{gateway.DefaultBaseDomain},
		DefaultAccess:      "public",
		MaxConnsPerSandbox: 1024,
		Audit:              DefaultAuditConfig(),
	}
}

// Resolved is c with what is empty filled from DefaultGatewayConfig (nil RouteDomains
// is the default, an empty list none; blank entries are dropped and BaseDomain added)
// and checked. Errors name the airlock.yaml key and the flag.
func (c GatewayConfig) Resolved() (GatewayConfig, error) {
	d := DefaultGatewayConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.RouteDomains == nil {
		c.RouteDomains = d.RouteDomains
	}
	domains := []string{}
	for _, s := range c.RouteDomains {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(domains, s) {
			domains = append(domains, s)
		}
	}
	if c.BaseDomain != "" && !slices.Contains(domains, c.BaseDomain) {
		domains = append(domains, c.BaseDomain)
	}
	c.RouteDomains = domains
	switch c.TLS {
	case "", string(gateway.TLSInternal):
	default:
		return c, fmt.Errorf("config: gateway.tls (--tls) %q: want \"\" or internal", c.TLS)
	}
	switch c.DefaultAccess {
	case "":
		c.DefaultAccess = d.DefaultAccess
	case "public", "token":
	default:
		return c, fmt.Errorf("config: gateway.defaultAccess %q: want public or token", c.DefaultAccess)
	}
	if c.MaxConnsPerSandbox == 0 {
		c.MaxConnsPerSandbox = d.MaxConnsPerSandbox
	}
	var err error
	if c.Audit, err = c.Audit.resolved(); err != nil {
		return c, err
	}
	return c, nil
}

// Gateway is a gateway built by NewGateway, with what it owns.
type Gateway struct {
	*gateway.Server
	// Registry holds the gateway's metrics.
	Registry *prometheus.Registry

	cfg      GatewayConfig
	metrics  *http.Server
	ownAudit *audit.Writer // opened by NewGateway from cfg.Audit
}

// NewGateway builds the gateway of cfg: the credentials it sends to lifecycle and
// admits from clients, its audit log (cfg.AuditWriter, else one opened from
// cfg.Audit), its metrics registry and the Caddy configuration. Start serves it.
func NewGateway(cfg GatewayConfig) (*Gateway, error) {
	cfg, err := cfg.Resolved()
	if err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, Registry: cfg.Registry}
	if g.Registry == nil {
		g.Registry = newRegistry()
	}
	gc := gateway.Config{
		Listen:             cfg.Listen,
		BaseDomains:        cfg.RouteDomains,
		WatchURL:           cfg.WatchURL,
		WatchFallbackURL:   cfg.WatchFallbackURL,
		WatchHeader:        cfg.WatchHeader.Clone(),
		SigningKeys:        cfg.SigningKeys,
		ExecdKey:           cfg.ExecdKey,
		ActiveKey:          cfg.ActiveKey,
		MaxConnsPerSandbox: cfg.MaxConnsPerSandbox,
		RenewURL:           cfg.RenewURL,
		EgressAPIDial:      cfg.EgressAPI,
		TLS:                gateway.TLSMode(cfg.TLS),
		DataDir:            cfg.DataDir,
		AdminListen:        cfg.AdminListen,
		AgentActions:       cfg.Audit.AgentActions,
		Metrics:            g.Registry,
		Log:                cfg.Log,
	}
	if gc.WatchHeader == nil {
		gc.WatchHeader = http.Header{}
	}
	if cfg.APIKey != "" {
		gc.WatchHeader.Set(opensandbox.HeaderAPIKey, cfg.APIKey)
		gc.RenewHeader = http.Header{}
		gc.RenewHeader.Set(opensandbox.HeaderAPIKey, cfg.APIKey)
		// Requests carrying the API key are admitted on token ports unless refused; the
		// gateway keeps only its SHA-256.
		if !cfg.RefuseAPIKey {
			gc.APIKeySHA256 = accesstoken.Sum(cfg.APIKey).String()
			gc.PrincipalKeysURL = cfg.KeysURL
		}
	}
	if cfg.NodeEgressdPort > 0 {
		gc.NodeGroups = &gateway.NodeGroupsConfig{Port: cfg.NodeEgressdPort, APIKey: cfg.APIKey}
	}
	if k := cmp.Or(cfg.EgressAPIKey, cfg.APIKey); k != "" {
		gc.EgressAPIHeader = http.Header{}
		gc.EgressAPIHeader.Set(opensandbox.HeaderAPIKey, k)
	}
	switch {
	case cfg.AuditWriter != nil:
		gc.Audit = cfg.AuditWriter
	case cfg.Audit.Dir != "":
		if g.ownAudit, err = OpenAudit(cfg.Audit, g.Registry, cfg.Log.With("component", "audit")); err != nil {
			return nil, err
		}
		gc.Audit = g.ownAudit
	default:
		cfg.Log.Warn("no audit log: request decisions are not recorded (set an audit directory)")
	}
	if g.Server, err = gateway.NewServer(gc); err != nil {
		return nil, errors.Join(err, g.closeAudit())
	}
	return g, nil
}

// Start serves the gateway, and /metrics when GatewayConfig.MetricsListen is set.
func (g *Gateway) Start() error {
	if err := g.Server.Start(); err != nil {
		return err
	}
	if g.cfg.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(g.Registry, promhttp.HandlerOpts{}))
		g.metrics = serveHTTP(g.cfg.MetricsListen, mux, g.cfg.Log)
	}
	return nil
}

// Close stops serving (requests in flight get the gateway's grace) and then closes
// the audit log NewGateway opened. Safe after a failed Start.
func (g *Gateway) Close() error {
	var errs []error
	if g.metrics != nil {
		errs = append(errs, g.metrics.Close())
	}
	errs = append(errs, g.Server.Close(), g.closeAudit())
	return errors.Join(errs...)
}

func (g *Gateway) closeAudit() error {
	if g.ownAudit == nil {
		return nil
	}
	return g.ownAudit.Close() // safe more than once
}

// serveHTTP serves h on addr in the background (metrics, health) until Close; a
// serving error is logged.
func serveHTTP(addr string, h http.Handler, log *slog.Logger) *http.Server {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http listener failed", "addr", addr, "err", err)
		}
	}()
	return srv
}
