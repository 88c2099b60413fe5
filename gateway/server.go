package gateway

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	// The Caddy modules an embedded gateway uses: the HTTP server and reverse proxy
	// (imported by this package already), TLS with the internal CA, and events
	// (reverse_proxy needs the events app).
	_ "github.com/caddyserver/caddy/v2/modules/caddyevents"
	_ "github.com/caddyserver/caddy/v2/modules/caddypki"
	_ "github.com/caddyserver/caddy/v2/modules/caddytls"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
	_ "github.com/caddyserver/caddy/v2/modules/logging"

	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
)

// Defaults of an embedded gateway (`airlock up`).
const (
	DefaultListen      = "127.0.0.1:8081"
	DefaultBaseDomain  = "airlock.localhost"
	DefaultIdleTimeout = 620 * time.Second
	DefaultGrace       = 5 * time.Second
)

// TLSMode selects how an embedded gateway serves TLS.
type TLSMode string

// TLS modes.
const (
	// TLSOff serves plain HTTP (HTTP/1.1 and h2c).
	TLSOff TLSMode = ""
	// TLSInternal serves HTTPS with certificates for *.<base domain> and <base domain>
	// from Caddy's internal CA, whose root is RootCertPath (not installed into any trust
	// store).
	TLSInternal TLSMode = "internal"
)

// Config configures an embedded gateway: one Caddy instance in this process running the
// airlock app and handler on one listener.
type Config struct {
	// Listen is the address to serve on; default 127.0.0.1:8081. Port 0 picks a free port
	// (see Server.Addr).
	Listen string
	// BaseDomains for host-form routing; nil means ["airlock.localhost"], an empty
	// non-nil slice disables host-form routing.
	BaseDomains []string
	// WatchURL and WatchHeader locate lifecycle's watch stream and carry its credential.
	// Empty WatchURL leaves the route table empty.
	WatchURL string
	// WatchFallbackURL is followed while WatchURL cannot be reached
	// (watch.ClientConfig.FallbackURL); empty: none.
	WatchFallbackURL string
	WatchHeader      http.Header
	// SigningKeys verify signed routes; ActiveKey names the minting key (default: the
	// first).
	SigningKeys []signedurl.Key
	ActiveKey   string
	// APIKeySHA256 is the SHA-256 of lifecycle's API key as 64 hex digits
	// (accesstoken.Sum(key).String()): requests carrying the key in OPEN-SANDBOX-API-KEY
	// are admitted on token ports (App.APIKeySHA256). Only the digest enters the gateway's
	// configuration, so no dump or log of it holds the key. Empty: the key admits nothing.
	APIKeySHA256 string
	// PrincipalKeysURL is lifecycle's GET /v1/keys/self: other API keys are admitted
	// by their principal's role (App.PrincipalKeys). Empty: only APIKeySHA256.
	PrincipalKeysURL string
	// ExecdKey is lifecycle's execd key (App.ExecdKey): the gateway derives each
	// sandbox's execd token from it. Empty: execd tokens admit nothing here.
	ExecdKey execdtoken.Key
	// MaxConnsPerSandbox: 0 means 1024, negative means no cap.
	MaxConnsPerSandbox int
	// RenewURL (with "{id}") and RenewHeader enable renew-on-access, for example
	// http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration with OPEN-SANDBOX-API-KEY.
	RenewURL    string
	RenewHeader http.Header
	// EgressAPIDial (lifecycle's host:port) and EgressAPIHeader send sandbox port 18080
	// to lifecycle's egress API (App.EgressAPI).
	EgressAPIDial   string
	EgressAPIHeader http.Header
	// NodeGroups has the egressd of a sandbox's node watch for the process groups of
	// execd commands where the gateway cannot (App.NodeGroups); nil: off.
	NodeGroups *NodeGroupsConfig
	// IdleTimeout closes idle client connections; default 620s (above common load
	// balancers' 600s).
	IdleTimeout time.Duration
	// ShutdownGrace bounds how long Close waits for requests in flight; default 5s.
	ShutdownGrace time.Duration
	// TLS selects plain HTTP (default) or the internal CA.
	TLS TLSMode
	// DataDir is Caddy's storage (certificates, internal CA); default Caddy's
	// ($XDG_DATA_HOME/caddy).
	DataDir string
	// AdminListen enables Caddy's admin API on that address; empty disables it.
	AdminListen string
	// CaddyLogLevel is the level of Caddy's own log (DEBUG, INFO, WARN, ERROR); default
	// WARN. The gateway itself logs to Log.
	CaddyLogLevel string

	// Audit receives one record per request decision; nil drops them.
	Audit AuditSink
	// AgentActions configures the records of agent actions through execd, written to
	// Audit (App.AgentActions).
	AgentActions execdaudit.Config
	// Metrics is where gateway metrics are registered; nil registers none.
	Metrics prometheus.Registerer
	// Log is the gateway's logger; nil discards.
	Log *slog.Logger
}

// ErrRunning is returned when a second embedded gateway starts in one process: Caddy runs
// one configuration per process.
var ErrRunning = errors.New("gateway: an embedded gateway is already running in this process")

var (
	runningMu sync.Mutex
	running   bool
)

// Server is an embedded gateway. Build it with NewServer, then Start and Close.
type Server struct {
	cfg      Config
	instance string
	json     []byte
	addr     net.Addr
	app      *App
	release  func()
	started  bool
}

// NewServer validates cfg and builds the Caddy configuration; it performs no I/O.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("gateway: listen address %q: %w", cfg.Listen, err)
	}
	if cfg.BaseDomains == nil {
		cfg.BaseDomains = []string{DefaultBaseDomain}
	}
	if _, err := normalizeDomains(cfg.BaseDomains); err != nil {
		return nil, err
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultGrace
	}
	if cfg.CaddyLogLevel == "" {
		cfg.CaddyLogLevel = "WARN"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	switch cfg.TLS {
	case TLSOff, TLSInternal:
	default:
		return nil, fmt.Errorf("gateway: TLS mode %q: want \"\" or %q", cfg.TLS, TLSInternal)
	}
	if cfg.TLS == TLSInternal && len(cfg.BaseDomains) == 0 {
		return nil, errors.New("gateway: TLS internal needs a base domain")
	}
	if cfg.WatchURL != "" {
		if u, err := url.Parse(cfg.WatchURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("gateway: watch URL %q: want http(s)://host[:port]/path", cfg.WatchURL)
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &Server{cfg: cfg, instance: "embedded-" + hex.EncodeToString(b[:])}
	var err error
	if s.json, err = s.caddyConfig(); err != nil {
		return nil, err
	}
	// Validate the app config the way Caddy will, without loading it.
	var app App
	if err := json.Unmarshal(s.appJSON(), &app); err != nil {
		return nil, err
	}
	if err := app.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// appConfig is the airlock app's JSON config.
func (s *Server) appConfig() App {
	c := s.cfg
	app := App{
		BaseDomains:        c.BaseDomains,
		ActiveKey:          c.ActiveKey,
		APIKeySHA256:       c.APIKeySHA256,
		MaxConnsPerSandbox: c.MaxConnsPerSandbox,
		Instance:           s.instance,
		AgentActions:       c.AgentActions,
	}
	if c.WatchURL != "" {
		app.Watch = &WatchConfig{URL: c.WatchURL, FallbackURL: c.WatchFallbackURL, Headers: c.WatchHeader}
	}
	if c.PrincipalKeysURL != "" {
		app.PrincipalKeys = &PrincipalKeysConfig{URL: c.PrincipalKeysURL}
	}
	if len(c.ExecdKey) > 0 {
		app.ExecdKey = c.ExecdKey.String()
	}
	for _, k := range c.SigningKeys {
		app.SigningKeys = append(app.SigningKeys, SigningKey{ID: k.ID, Secret: "base64:" + base64.StdEncoding.EncodeToString(k.Secret)})
	}
	if c.RenewURL != "" {
		app.Renew = &RenewConfig{URL: c.RenewURL, Headers: c.RenewHeader}
	}
	if c.EgressAPIDial != "" {
		app.EgressAPI = &EgressAPIConfig{Dial: c.EgressAPIDial, Headers: c.EgressAPIHeader}
	}
	app.NodeGroups = c.NodeGroups
	return app
}

func (s *Server) appJSON() []byte {
	b, _ := json.Marshal(s.appConfig())
	return b
}

// caddyConfig returns the whole Caddy JSON configuration.
func (s *Server) caddyConfig() ([]byte, error) {
	c := s.cfg
	server := map[string]any{
		"listen":          []string{c.Listen},
		"protocols":       []string{"h1", "h2c"},
		"idle_timeout":    c.IdleTimeout.String(),
		"automatic_https": map[string]any{"disable": true},
		"routes":          []any{map[string]any{"handle": []any{map[string]any{"handler": "airlock"}}}},
	}
	apps := map[string]any{
		"airlock": json.RawMessage(s.appJSON()),
		"http": map[string]any{
			"grace_period": c.ShutdownGrace.String(),
			"servers":      map[string]any{"airlock": server},
		},
	}
	if c.TLS == TLSInternal {
		var subjects []string
		for _, d := range c.BaseDomains {
			d = strings.Trim(strings.ToLower(d), ".")
			subjects = append(subjects, "*."+d, d)
		}
		server["tls_connection_policies"] = []any{map[string]any{}}
		server["protocols"] = []string{"h1", "h2"}
		apps["tls"] = map[string]any{
			"certificates": map[string]any{"automate": subjects},
			"automation": map[string]any{"policies": []any{map[string]any{
				"subjects": subjects,
				"issuers":  []any{map[string]any{"module": "internal"}},
			}}},
		}
		apps["pki"] = map[string]any{"certificate_authorities": map[string]any{
			"local": map[string]any{"install_trust": false},
		}}
	}
	admin := map[string]any{"disabled": true, "config": map[string]any{"persist": false}}
	if c.AdminListen != "" {
		admin = map[string]any{"listen": c.AdminListen, "config": map[string]any{"persist": false}}
	}
	cfg := map[string]any{
		"admin":   admin,
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": c.CaddyLogLevel, "encoder": logEncoder()}}},
		"apps":    apps,
	}
	if c.DataDir != "" {
		cfg["storage"] = map[string]any{"module": "file_system", "root": c.DataDir}
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// CaddyJSON returns the Caddy configuration the server loads (secrets included: do not
// log it).
func (s *Server) CaddyJSON() []byte { return s.json }

// Start loads the configuration into Caddy and starts serving. Only one embedded gateway
// may run per process (ErrRunning).
func (s *Server) Start() error {
	runningMu.Lock()
	defer runningMu.Unlock()
	if running {
		return ErrRunning
	}
	release, err := RegisterHooks(s.instance, Hooks{Audit: s.cfg.Audit, Metrics: s.cfg.Metrics, Log: s.cfg.Log})
	if err != nil {
		return err
	}
	if err := caddy.Load(s.json, true); err != nil {
		release()
		return fmt.Errorf("gateway: starting caddy: %w", err)
	}
	ctx := caddy.ActiveContext()
	httpApp, err := ctx.App("http")
	if err == nil {
		if srv := httpApp.(*caddyhttp.App).Servers["airlock"]; srv != nil && len(srv.Listeners()) > 0 {
			s.addr = srv.Listeners()[0].Addr()
		}
	}
	if a, err := ctx.App("airlock"); err == nil {
		s.app = a.(*App)
	}
	if s.addr == nil || s.app == nil {
		_ = caddy.Stop()
		release()
		return errors.New("gateway: caddy started without the airlock server")
	}
	s.release, s.started, running = release, true, true
	s.cfg.Log.Info("gateway listening", "addr", s.addr.String(), "base_domains", s.cfg.BaseDomains, "tls", string(s.cfg.TLS))
	return nil
}

// Addr returns the address the gateway listens on (after Start).
func (s *Server) Addr() string {
	if s.addr == nil {
		return ""
	}
	return s.addr.String()
}

// App returns the running airlock app (route table, watch status), nil before Start.
func (s *Server) App() *App { return s.app }

// RootCertPath returns the internal CA's root certificate file when TLS is internal.
func (s *Server) RootCertPath() string {
	if s.cfg.TLS != TLSInternal {
		return ""
	}
	return filepath.Join(caddyDataDir(s.cfg.DataDir), "pki", "authorities", "local", "root.crt")
}

func caddyDataDir(dir string) string {
	if dir != "" {
		return dir
	}
	return caddy.AppDataDir()
}

// Close stops Caddy (waiting up to ShutdownGrace for requests in flight). It is safe to
// call more than once and after a failed Start.
func (s *Server) Close() error {
	runningMu.Lock()
	defer runningMu.Unlock()
	if !s.started {
		return nil
	}
	err := caddy.Stop()
	s.release()
	s.started, running = false, false
	return err
}
