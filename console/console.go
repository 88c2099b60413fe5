// Package console is Airlock's operator console: a web UI served by `airlock up` (and
// by each `airlock lifecycle` replica on Kubernetes, package cluster) under /console/
// on the lifecycle API's listener. It is plain HTML, CSS and JavaScript modules
// embedded in the binary (no build step), talking to a small JSON API of its own:
//
//   - /console/api/v1/…: the lifecycle API (sandboxes, endpoints, policies), called
//     in-process with the signed-in key, which never reaches the browser;
//   - /console/api/sandboxes/{id}/events: a sandbox's audit records, live, as
//     Server-Sent Events;
//   - /console/api/audit…: search, chain verification, JSON Lines export and the
//     per-minute statistics the charts draw.
//
// An operator signs in with any API key (a principal with a role, package principal)
// and gets a server-side session (an HttpOnly, SameSite=Strict cookie scoped to
// /console); the session calls the API with that key, so the console can do exactly
// what the key's role allows and shows the rest hidden or refused. Every write needs
// the session's CSRF token in a header and a same-origin request (Origin and
// Sec-Fetch-Site).
package console

import (
	"crypto/ed25519"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/principal"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// DefaultSessionTTL is how long a session lasts when Config.SessionTTL is zero.
const DefaultSessionTTL = 12 * time.Hour

//go:embed assets
var assetFS embed.FS

// Config configures a Console. API is required.
type Config struct {
	// API is the lifecycle API's handler (lifecycle.Server.Handler): the console calls
	// it in-process, adding the session's key. It must serve /v1/sandboxes….
	API http.Handler
	// APIKey is the server's configured key (the first admin). Empty means the API has
	// no authentication (airlock up --no-auth): the login page says so and a session is
	// opened without a key (writes still need the CSRF token).
	APIKey string
	// Authenticate returns the principal of an API key (lifecycle.Server.Keys's
	// Authenticate; it performs no I/O). Operators sign in with any key; the session
	// sends that key to API, so it may do what the key's role allows, and ends when the
	// key stops authenticating. Nil: only APIKey signs in, as the admin.
	Authenticate func(key string) (principal.Principal, bool)
	// AuditDir is the audit log's directory (package audit); empty disables the live
	// stream, search, verification, export and charts (they answer 501).
	AuditDir string
	// AuditPublicKey, when set, checks checkpoint signatures on verification.
	AuditPublicKey ed25519.PublicKey
	// Overlay is the operator layer the explain box compiles sandbox policies with, as
	// egressd does; nil means policies.BaseOverlay().
	Overlay *policies.Overlay
	// SessionTTL is a session's lifetime from login; default DefaultSessionTTL (12 h).
	SessionTTL time.Duration
	// EndpointScheme is put in front of the scheme-less endpoints lifecycle returns:
	// "http" (default) or "https" (gateway TLS).
	EndpointScheme string
	// TrustedOrigins are extra origins ("https://console.example.com") whose writes are
	// accepted besides the request's own (a TLS-terminating proxy in front of the API).
	TrustedOrigins []string
	// DefaultImage pre-fills the create form; default airlock/sandbox:latest.
	DefaultImage string
	// GatewayDomain is the gateway's base domain for host-form routes
	// ("airlock.localhost"): a desktop sandbox's page embeds noVNC from
	// "<6080-id-exp-tag>.<GatewayDomain>" (desktop.go). Empty: no live desktop.
	GatewayDomain string
	// Audit receives a control record (source control) for every sign-in, failed or
	// refused sign-in and sign-out (op console.sign_in, console.sign_out; the
	// principal when known, never the key or a session id); nil means none.
	Audit interface{ Append(audit.Record) }
	// Log receives login, logout and failure records (never the key or a session id).
	Log *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Console is the console's HTTP handler. It is safe for concurrent use.
type Console struct {
	cfg      Config
	log      *slog.Logger
	sessions *sessions
	origins  originCheck
	mux      *http.ServeMux
	static   http.Handler
	pages    *template.Template
	logins   *loginLimiter
	// closed ends the live streams (Close).
	closed    chan struct{}
	closeOnce sync.Once
}

// New checks cfg and builds the console; it performs no I/O.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil {
		return nil, errors.New("console: API is required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	switch cfg.EndpointScheme {
	case "":
		cfg.EndpointScheme = "http"
	case "http", "https":
	default:
		return nil, errors.New(`console: EndpointScheme must be "http" or "https"`)
	}
	if cfg.Overlay == nil {
		cfg.Overlay = policies.BaseOverlay()
	}
	if cfg.DefaultImage == "" {
		cfg.DefaultImage = "airlock/sandbox:latest"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	origins, err := newOriginCheck(cfg.TrustedOrigins)
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(assetFS, "assets")
	if err != nil {
		return nil, err
	}
	pages, err := template.ParseFS(sub, "*.html")
	if err != nil {
		return nil, err
	}
	c := &Console{
		cfg:      cfg,
		log:      cfg.Log,
		sessions: newSessions(cfg.SessionTTL, cfg.Now),
		origins:  origins,
		mux:      http.NewServeMux(),
		static:   http.StripPrefix(Prefix+"static/", http.FileServerFS(sub)),
		pages:    pages,
		logins:   newLoginLimiter(cfg.Now),
		closed:   make(chan struct{}),
	}
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := c.mux
	m.HandleFunc("GET /console/static/", c.handleStatic)
	m.HandleFunc("GET /console/login", c.handleLoginPage)
	m.HandleFunc("POST /console/login", c.handleLogin)
	m.Handle("POST /console/logout", c.write(c.handleLogout))

	m.Handle("GET /console/{$}", c.page("sandboxes"))
	m.Handle("GET /console/sandboxes/{id}", c.page("sandbox"))
	m.Handle("GET /console/audit", c.page("audit"))
	m.Handle("GET /console/keys", c.page("keys"))

	m.Handle("GET /console/api/session", c.read(c.handleSession))
	m.Handle("GET /console/api/sandboxes", c.read(c.handleSandboxes))
	m.Handle("GET /console/api/sandboxes/{id}/events", c.read(c.handleEvents))
	m.Handle("GET /console/api/sandboxes/{id}/explain", c.read(c.handleExplain))
	m.Handle("GET /console/api/sandboxes/{id}/timeline", c.read(c.handleTimeline))
	m.Handle("GET /console/api/sandboxes/{id}/desktop", c.read(c.handleDesktop))
	m.Handle("POST /console/api/sandboxes/{id}/screenshot", c.write(c.handleScreenshot))
	m.Handle("GET /console/api/sandboxes/{id}/browser", c.read(c.handleBrowser))
	m.Handle("GET /console/api/floor", c.read(c.handleFloor))
	m.Handle("GET /console/api/audit", c.read(c.allow(principal.ReadAudit, c.handleAuditSearch)))
	m.Handle("GET /console/api/audit/verify", c.read(c.allow(principal.ReadAudit, c.handleVerify)))
	m.Handle("GET /console/api/audit/export", c.read(c.allow(principal.ReadAudit, c.handleExport)))
	m.Handle("GET /console/api/stats", c.read(c.allow(principal.ReadAudit, c.handleStats)))
	m.Handle("/console/api/v1/", c.api())
	c.terminalRoutes(m)
	m.HandleFunc("/console/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "no console API route "+r.Method+" "+r.URL.Path)
	})
	m.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "404 page not found", http.StatusNotFound)
	})
}

// Close ends the live audit streams (an http.Server's Shutdown waits for them
// otherwise: register it with RegisterOnShutdown). Safe to call more than once.
func (c *Console) Close() {
	c.closeOnce.Do(func() { close(c.closed) })
}

// Front is the API listener's handler with the console on it: c under Prefix, api
// (lifecycle's handler) for every other path.
func (c *Console) Front(api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(Prefix, c)
	mux.Handle("/", api)
	return mux
}

// ServeHTTP serves everything under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"+c.frameSources())
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// Signed URLs and sandbox ids must not leak to the sites endpoints link to; within
	// the console the referrer stays, since with no-referrer browsers send "Origin:
	// null" on same-origin form posts and fetches (Fetch §3.1 "serializing a request
	// origin"), which the origin check refuses.
	h.Set("Referrer-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/console/static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) handleStatic(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, ".html") || strings.HasSuffix(r.URL.Path, "/") {
		http.NotFound(w, r) // pages are templates, served by their routes
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	c.static.ServeHTTP(w, r)
}

// pageData fills the page templates. The navigation shows only the pages the
// principal's role may use (the API refuses the rest anyway).
type pageData struct {
	Page    string
	Title   string
	CSRF    string
	NoAuth  bool
	Image   string
	Scheme  string
	Error   string
	Notice  string
	Expires time.Time
	// Who is the signed-in principal; Audit and Keys say whether its role may read the
	// audit log and manage API keys.
	Who   principal.Principal
	Audit bool
	Keys  bool
}

// page serves the shell of one page of the signed-in console; without a session it
// redirects to the login page (saying so when the session expired).
func (c *Console) page(name string) http.Handler {
	titles := map[string]string{"sandboxes": "Sandboxes", "sandbox": "Sandbox", "audit": "Audit log", "keys": "API keys"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, state := c.liveSession(r)
		if s == nil {
			q := "?next=" + urlQueryEscape(r.URL.Path)
			if state == sessionExpired {
				q += "&expired=1"
			}
			http.Redirect(w, r, Prefix+"login"+q, http.StatusSeeOther)
			return
		}
		who := s.principal()
		c.render(w, http.StatusOK, "page.html", pageData{Page: name, Title: titles[name], CSRF: s.csrf,
			Who: who, Audit: who.Role.Allows(principal.ReadAudit), Keys: who.Role.Allows(principal.ManageKeys),
			NoAuth: c.cfg.APIKey == "", Image: c.cfg.DefaultImage, Scheme: c.cfg.EndpointScheme, Expires: s.expires})
	})
}

func (c *Console) render(w http.ResponseWriter, status int, name string, d pageData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.pages.ExecuteTemplate(w, name, d); err != nil {
		c.log.Error("rendering a console page failed", "page", name, "err", err)
	}
}
