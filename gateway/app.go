// Package gateway is Airlock's ingress: Caddy v2 modules that give every sandbox port its
// own URL (docs/architecture.md#ingress-the-gateway).
//
//   - App "airlock": the route table (package routetable), fed by the lifecycle watch
//     stream (package lifecycle/watch) in Start/Stop, plus the signing keys, the
//     per-sandbox connection cap and the renew-on-access sender.
//   - Handler "http.handlers.airlock": routes a request by header, host label or path
//     (package route), admits it (public, or the sandbox's token, the API key (package
//     accesstoken) or a signed URL (package signedurl); execd 44772 and the egress API
//     18080 are never public), strips routing and credential headers and the path
//     prefix, and proxies it through an embedded Caddy reverse_proxy whose dynamic
//     upstream source is…
//   - Upstreams "http.reverse_proxy.upstreams.airlock": hands reverse_proxy the dial
//     address the handler decided, so one pooled transport serves every sandbox.
//   - Permission "tls.permission.airlock": on-demand TLS only for hosts in the table.
//
// The same modules run in the airlock binary (Server, for `airlock up` and
// `airlock gateway`) and in a stock Caddy built with xcaddy. README.md has the Caddyfile
// syntax, JSON config, TLS setups and metrics.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

func init() {
	caddy.RegisterModule(App{})
}

// Defaults.
const (
	DefaultMaxConnsPerSandbox = 1024
	DefaultRenewInterval      = time.Minute
	DefaultRenewTimeout       = 10 * time.Second
	// DefaultMaxCertificatesPerSandbox is App.MaxCertificatesPerSandbox's default.
	DefaultMaxCertificatesPerSandbox = 16
)

// App is the airlock Caddy app: the route table and what feeds it. Its JSON lives under
// "apps": {"airlock": {…}}; the Caddyfile sets it with the global option `airlock`.
type App struct {
	// Watch is the lifecycle watch stream that feeds the route table. Without it the
	// table stays empty (useful only for tests).
	Watch *WatchConfig `json:"watch,omitempty"`

	// BaseDomains are the domains under which host labels name sandboxes
	// ("<port>-<id>.<domain>"), for example ["airlock.localhost"]. Handlers may override.
	BaseDomains []string `json:"base_domains,omitempty"`

	// SigningKeys verify signed routes; ActiveKey names the one that mints (lifecycle
	// mints, the gateway only verifies, but both share the keys). Secrets are
	// "base64:…" or "hex:…" and may use placeholders such as {env.AIRLOCK_KEY_A}.
	SigningKeys []SigningKey `json:"signing_keys,omitempty"`
	ActiveKey   string       `json:"active_key,omitempty"`

	// APIKeySHA256 is the SHA-256 (64 hex digits) of lifecycle's API key: a request
	// carrying that key in OPEN-SANDBOX-API-KEY is admitted on every token port (execd
	// 44772 and the egress API 18080 always are). APIKey is the key itself instead,
	// typically a placeholder such as {env.OPEN_SANDBOX_API_KEY}; the app keeps only its
	// digest. Without either the API key admits nothing at the gateway. The header never
	// reaches a sandbox.
	APIKeySHA256 string `json:"api_key_sha256,omitempty"`
	APIKey       string `json:"api_key,omitempty"`

	// PrincipalKeys admits lifecycle's other API keys by their principal's role,
	// looked up at lifecycle (PrincipalKeysConfig); nil: only the key above.
	PrincipalKeys *PrincipalKeysConfig `json:"principal_keys,omitempty"`

	// ExecdKey is lifecycle's execd key ("base64:…" or "hex:…", package
	// internal/execdtoken; placeholders such as {env.AIRLOCK_EXECD_KEY} work): the
	// gateway derives each sandbox's execd token from it, sends the token to execd (port
	// 44772) with every request it admits there, and admits a request to that port that
	// carries the token in X-EXECD-ACCESS-TOKEN (as the endpoint lists it). Without it
	// the gateway forwards the client's X-EXECD-ACCESS-TOKEN to execd unchecked and
	// admits by it nothing.
	ExecdKey string `json:"execd_key,omitempty"`

	// MaxConnsPerSandbox caps the requests and streams in flight to one sandbox (all its
	// ports together); over the cap the gateway answers 429. 0 means 1024; negative
	// removes the cap.
	MaxConnsPerSandbox int `json:"max_conns_per_sandbox,omitempty"`

	// Renew enables renew-on-access intents to lifecycle for sandboxes that opted in.
	Renew *RenewConfig `json:"renew,omitempty"`

	// EgressAPI, when set, sends requests for sandbox port 18080 (the OpenSandbox egress
	// API, egress-api.yaml) to lifecycle, which answers /policy itself: Airlock runs no
	// sidecar in the sandbox. Access checks of the sandbox's port apply first.
	EgressAPI *EgressAPIConfig `json:"egress_api,omitempty"`

	// AgentActions configures the records of agent actions through execd (port
	// 44772): commands, code, sessions, PTYs and file changes, written to the audit
	// sink with source execd (package audit/execdaudit). On whenever the app has an
	// audit sink, unless disabled; hash_commands stores the SHA-256 of command text
	// and code instead of the text.
	AgentActions execdaudit.Config `json:"agent_actions,omitzero"`

	// NodeGroups, when set with agent actions on, names the process group of each
	// execd command (extra.process_group) where the gateway has no view of the
	// sandbox's /proc (Runtime.Pid 0: Kubernetes): the egressd of the sandbox's node
	// (Runtime.HostIP) watches for it (execdaudit.GroupsPath). Nil: such commands
	// name no group.
	NodeGroups *NodeGroupsConfig `json:"node_groups,omitempty"`

	// TombstoneTTL is how long a deleted sandbox answers 410 Gone instead of 404;
	// default 1h.
	TombstoneTTL caddy.Duration `json:"tombstone_ttl,omitempty"`

	// MaxCertificatesPerSandbox caps the distinct host names the on-demand TLS
	// permission (tls.permission.airlock) lets Caddy obtain certificates for, per
	// sandbox, for the app's lifetime (a deleted sandbox's count is dropped): without a
	// cap anyone who knows a sandbox id could have a certificate issued for every one of
	// its 65535 ports, twice. 0 means 16; negative removes the cap.
	MaxCertificatesPerSandbox int `json:"max_certificates_per_sandbox,omitempty"`

	// SignedHostCertificates lets on-demand TLS obtain certificates for signed host
	// labels ("<port>-<id>-<exp>-<tag>.<domain>") whose tag verifies, never for control
	// ports. Off by default: a certificate is published in Certificate Transparency
	// logs, so its signed host label, a working credential until it expires, becomes
	// public. Lifecycle mints signed endpoints in the path form; serve signed host
	// labels under a wildcard certificate instead.
	SignedHostCertificates bool `json:"signed_host_certificates,omitempty"`

	// Instance names the Go values (audit sink, metrics registry, logger) that an
	// embedding program registered for this app (see Server). Empty in stock Caddy: the
	// app then uses Caddy's metrics registry and logger and has no audit sink.
	Instance string `json:"instance,omitempty"`

	table *routetable.Table
	// upstream tracks the proxy's connections to sandboxes: a deletion closes them.
	upstream *upstreamConns
	keys     *signedurl.Keyring
	apiKey   *accesstoken.Digest
	// principals looks up other API keys (PrincipalKeys); nil: none admitted.
	principals *principalKeys
	execdKey   execdtoken.Key
	domains    []string
	maxConns   int
	certs      *certHosts
	watcher    *watch.Client
	renewer    *renewer
	metrics    *metrics
	audit      AuditSink
	// agentAudit records agent actions through execd; nil: none.
	agentAudit *execdaudit.Observer
	// nodeGroups asks nodes' egressd for commands' process groups; nil: off.
	nodeGroups *execdaudit.RemoteGroups
	log        *slog.Logger
	cancel     context.CancelFunc
	wg         *sync.WaitGroup
}

// WatchConfig locates the lifecycle watch stream.
type WatchConfig struct {
	// URL of the watch endpoint, for example http://127.0.0.1:8080/internal/v1/watch.
	URL string `json:"url"`
	// Headers are sent with every watch request (the credential). Values may use
	// placeholders such as {env.AIRLOCK_API_KEY}.
	Headers http.Header `json:"headers,omitempty"`
	// FallbackURL is followed while URL cannot be reached, 30 s at a time
	// (watch.ClientConfig.FallbackURL): on Kubernetes URL is the leading lifecycle
	// replica's Service and FallbackURL every replica's. Empty: none.
	FallbackURL string `json:"fallback_url,omitempty"`
	// MaxBackoff caps the wait between reconnects; default 5s.
	MaxBackoff caddy.Duration `json:"max_backoff,omitempty"`
}

// SigningKey is one signed-route key: a one-character id ([0-9a-z]) and its secret.
type SigningKey struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

// RenewConfig configures renew-on-access intents.
// EgressAPIConfig names lifecycle's server proxy for port 18080.
type EgressAPIConfig struct {
	// Dial is lifecycle's host:port; the request goes to
	// /sandboxes/<id>/proxy/18080/<path> there.
	Dial string `json:"dial"`
	// Headers are added to the forwarded request, for example OPEN-SANDBOX-API-KEY.
	Headers http.Header `json:"headers,omitempty"`
}

type RenewConfig struct {
	// URL receives POST {"expiresAt": "<RFC 3339>"}; "{id}" is replaced by the sandbox id,
	// for example http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration.
	URL string `json:"url"`
	// Headers are sent with every intent, for example OPEN-SANDBOX-API-KEY.
	Headers http.Header `json:"headers,omitempty"`
	// Interval is the least time between two intents for one sandbox; default and
	// minimum 1m.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one intent; default 10s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

func (c *RenewConfig) header() http.Header { return c.Headers.Clone() }

// NodeGroupsConfig is where each node's egressd serves execdaudit.GroupsPath: Port
// on the node's address (`airlock egressd --metrics-listen`, 9102 in the Kubernetes
// manifests), with APIKey sent as OPEN-SANDBOX-API-KEY (placeholders such as
// {env.OPEN_SANDBOX_API_KEY} work).
type NodeGroupsConfig struct {
	Port   int    `json:"port"`
	APIKey string `json:"api_key,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "airlock", New: func() caddy.Module { return new(App) }}
}

// Provision sets defaults, decodes keys and builds the table, metrics and watch client.
// It performs no network I/O.
func (a *App) Provision(ctx caddy.Context) error {
	var hooks Hooks
	if a.Instance != "" {
		h, ok := lookupHooks(a.Instance)
		if !ok {
			return fmt.Errorf("airlock: no embedded instance %q registered", a.Instance)
		}
		hooks = h
	}
	a.log = hooks.Log
	if a.log == nil {
		a.log = ctx.Slogger()
	}
	a.audit = hooks.Audit
	if a.audit != nil {
		a.agentAudit = execdaudit.New(a.audit, a.AgentActions, "gateway")
	}
	repl := caddy.NewReplacer()

	domains, err := normalizeDomains(a.BaseDomains)
	if err != nil {
		return err
	}
	a.domains = domains

	if len(a.SigningKeys) > 0 {
		keys := make([]signedurl.Key, 0, len(a.SigningKeys))
		for _, k := range a.SigningKeys {
			secret, err := signedurl.DecodeSecret(repl.ReplaceKnown(k.Secret, ""))
			if err != nil {
				return fmt.Errorf("airlock: signing key %q: %w", k.ID, err)
			}
			keys = append(keys, signedurl.Key{ID: k.ID, Secret: secret})
		}
		active := a.ActiveKey
		if active == "" {
			active = a.SigningKeys[0].ID
		}
		if a.keys, err = signedurl.NewKeyring(active, keys...); err != nil {
			return fmt.Errorf("airlock: %w", err)
		}
	}

	if ng := a.NodeGroups; ng != nil && a.agentAudit != nil {
		if ng.Port <= 0 || ng.Port > 65535 {
			return fmt.Errorf("airlock: node_groups.port %d is not a port", ng.Port)
		}
		a.nodeGroups = execdaudit.NewRemoteGroups(ng.Port, repl.ReplaceKnown(ng.APIKey, ""), a.log)
	}

	switch key, sum := repl.ReplaceKnown(a.APIKey, ""), repl.ReplaceKnown(a.APIKeySHA256, ""); {
	case key != "" && sum != "":
		return errors.New("airlock: set api_key or api_key_sha256, not both")
	case key != "":
		d := accesstoken.Sum(key)
		a.apiKey = &d
	case sum != "":
		d, err := accesstoken.ParseDigest(sum)
		if err != nil {
			return fmt.Errorf("airlock: api_key_sha256: %w", err)
		}
		a.apiKey = &d
	}

	if pk := a.PrincipalKeys; pk != nil {
		if pk.URL == "" {
			return errors.New("airlock: principal_keys.url is empty (lifecycle's /v1/keys/self)")
		}
		a.principals = newPrincipalKeys(pk)
	}

	if k := repl.ReplaceKnown(a.ExecdKey, ""); k != "" {
		if a.execdKey, err = execdtoken.ParseKey(k); err != nil {
			return fmt.Errorf("airlock: execd_key: %w", err)
		}
	}

	switch {
	case a.MaxConnsPerSandbox == 0:
		a.maxConns = DefaultMaxConnsPerSandbox
	case a.MaxConnsPerSandbox < 0:
		a.maxConns = 0
	default:
		a.maxConns = a.MaxConnsPerSandbox
	}
	a.certs = &certHosts{max: max(a.MaxCertificatesPerSandbox, 0)}
	if a.MaxCertificatesPerSandbox == 0 {
		a.certs.max = DefaultMaxCertificatesPerSandbox
	}

	var reg prometheus.Registerer = ctx.GetMetricsRegistry()
	if a.Instance != "" {
		reg = hooks.Metrics
	}
	a.metrics, err = newMetrics(reg, a.watchStatus)
	if err != nil {
		return err
	}
	a.upstream = newUpstreamConns()
	a.table = routetable.New(routetable.Config{
		TombstoneTTL: time.Duration(a.TombstoneTTL),
		OnChange:     func(n int) { a.metrics.routes.Set(float64(n)) },
		OnDelete: func(s *watch.Sandbox) {
			a.certs.forget(s.ID)
			a.upstream.closeAddr(s.Address)
			a.upstream.closeAddr(s.Address6)
		},
	})

	if a.Watch != nil {
		wurl := repl.ReplaceKnown(a.Watch.URL, "")
		a.watcher, err = watch.NewClient(watch.ClientConfig{
			URL:         wurl,
			FallbackURL: repl.ReplaceKnown(a.Watch.FallbackURL, ""),
			Header:      replaceHeader(repl, a.Watch.Headers),
			MaxBackoff:  time.Duration(a.Watch.MaxBackoff),
			Log:         a.log.With("component", "watch"),
		})
		if err != nil {
			return fmt.Errorf("airlock: %w", err)
		}
	} else {
		a.log.Warn("airlock app has no watch configured: the route table stays empty")
	}

	if a.Renew != nil {
		rc := *a.Renew
		rc.URL = repl.ReplaceKnown(rc.URL, "")
		rc.Headers = replaceHeader(repl, rc.Headers)
		if rc.Interval == 0 {
			rc.Interval = caddy.Duration(DefaultRenewInterval)
		}
		if rc.Timeout == 0 {
			rc.Timeout = caddy.Duration(DefaultRenewTimeout)
		}
		a.renewer = newRenewer(&rc, a.metrics.renew, a.log.With("component", "renew"))
	}
	return nil
}

// Validate checks the configuration; it is pure.
func (a *App) Validate() error {
	if r := a.Renew; r != nil {
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.Contains(r.URL, "{id}") {
			return fmt.Errorf("airlock: renew url %q: want http(s)://…/{id}/… with the {id} placeholder", r.URL)
		}
		if r.Interval != 0 && time.Duration(r.Interval) < DefaultRenewInterval {
			return fmt.Errorf("airlock: renew interval %s is below the minimum of 1m", time.Duration(r.Interval))
		}
	}
	return nil
}

// Start begins following the watch stream and sending renew intents.
func (a *App) Start() error {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.wg = new(sync.WaitGroup)
	if a.watcher != nil {
		a.wg.Go(func() { _ = a.watcher.Run(ctx, a.table) })
	}
	if a.renewer != nil {
		a.renewer.run(ctx)
	}
	return nil
}

// Stop ends the watch and the renew workers and waits for them. The table keeps its
// content until the app is cleaned up.
func (a *App) Stop() error {
	if a.cancel == nil {
		return nil
	}
	a.cancel()
	a.wg.Wait()
	if a.renewer != nil {
		a.renewer.wait()
	}
	return nil
}

// Cleanup releases the metrics.
func (a *App) Cleanup() error {
	a.metrics.unregister()
	return nil
}

// Table returns the route table (valid after Provision).
func (a *App) Table() *routetable.Table { return a.table }

// WatchStatus returns the watch client's status; zero when no watch is configured.
func (a *App) WatchStatus() watch.Status {
	if a.watcher == nil {
		return watch.Status{}
	}
	return a.watcher.Status()
}

func (a *App) watchStatus() (bool, float64, int) {
	s := a.WatchStatus()
	return s.Connected, s.Lag.Seconds(), s.Reconnects
}

// normalizeDomains lowercases, trims dots, drops duplicates and orders longest first so a
// more specific domain wins.
func normalizeDomains(in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, d := range in {
		d = strings.ToLower(strings.Trim(strings.TrimSpace(d), "."))
		if d == "" || strings.ContainsAny(d, "/:* ") {
			return nil, fmt.Errorf("airlock: base domain %q: want a plain domain such as airlock.localhost", d)
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

func replaceHeader(repl *caddy.Replacer, h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		for _, v := range vs {
			out.Add(k, repl.ReplaceKnown(v, ""))
		}
	}
	return out
}

// Hooks are the Go values an embedding program hands the app; JSON cannot carry them.
type Hooks struct {
	// Audit receives one record per request decision; nil drops them.
	Audit AuditSink
	// Metrics is where the gateway registers its metrics; nil registers nowhere.
	Metrics prometheus.Registerer
	// Log is the gateway's logger; nil uses Caddy's.
	Log *slog.Logger
}

var (
	hooksMu sync.Mutex
	hooks   = map[string]Hooks{}
)

// RegisterHooks makes h available to an App whose Instance is name, until the returned
// release is called.
func RegisterHooks(name string, h Hooks) (release func(), err error) {
	hooksMu.Lock()
	defer hooksMu.Unlock()
	if _, ok := hooks[name]; ok {
		return nil, errors.New("airlock: hooks instance " + name + " already registered")
	}
	hooks[name] = h
	return func() {
		hooksMu.Lock()
		delete(hooks, name)
		hooksMu.Unlock()
	}, nil
}

func lookupHooks(name string) (Hooks, bool) {
	hooksMu.Lock()
	defer hooksMu.Unlock()
	h, ok := hooks[name]
	return h, ok
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
