// Package lifecycle is Airlock's control plane: the OpenSandbox lifecycle REST server
// (docs/spec/sandbox-lifecycle.yml and docs/spec/NOTES.md, served at / and /v1), the
// sandbox registry persisted in a StateStore (lifecycle/boltstore on one host,
// lifecycle/kubestore on Kubernetes), the expiry reaper, the reconciler that rebuilds
// the registry from the runtime's containers on start, the server proxy
// (/sandboxes/{id}/proxy/{port}/…) and the watch API that feeds the data plane
// (package watch, served at /internal/v1/watch).
//
// A Server owns its Runtime calls: it never runs two mutating operations on one sandbox
// at once. Errors reaching clients are the protocol's JSON envelope
// (opensandbox.ErrorBody: code, message, requestId); errors.go maps the package's
// sentinel errors to status and code.
package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/principal"
)

// Config configures a Server. Runtime and Store are required.
type Config struct {
	Runtime Runtime
	Store   StateStore
	// APIKey is the OPEN-SANDBOX-API-KEY every request must carry (except GET /health
	// and server proxy requests carrying the sandbox's access token); empty means no
	// authentication (New logs a warning), except that execd and the egress API behind
	// the server proxy still need the sandbox's access token. It is the admin principal
	// principal.ConfiguredAdminID; more keys, each a principal with a role, are made
	// through /v1/keys and kept in Keys.
	APIKey string
	// Keys stores the API keys made through /v1/keys (hashed; package principal). Nil:
	// the Store when it implements principal.Store (boltstore, kubestore), else memory
	// (keys are lost at restart).
	Keys principal.Store
	// KeyRefresh is how often the keys are re-read from Keys, so that a key revoked
	// through another replica sharing the store stops working here; default 500 ms
	// with a SharedStore, never otherwise (this server makes every change itself).
	KeyRefresh time.Duration
	// GatewayKey, when set, is a second OPEN-SANDBOX-API-KEY value accepted by the server
	// proxy only (/sandboxes/{id}/proxy/…), never by the rest of the API: the gateway
	// sends it when it forwards a request it has already admitted (sandbox port 18080,
	// whose egress API lifecycle answers). airlock up makes a random one per start.
	GatewayKey string
	// ExecdKey derives every sandbox's execd token (package internal/execdtoken): the
	// runtime delivers it into the sandbox (Spec.ExecdToken), this server sends it on its
	// server proxy to execd's port and on the release calls, and the endpoint of that
	// port lists it under X-EXECD-ACCESS-TOKEN. The gateway must derive with the same
	// key. Empty: New makes a random one, so sandboxes created before a restart no longer
	// answer this server (airlock up stores its key in the state directory).
	ExecdKey execdtoken.Key
	// DefaultAccess is the admission mode of sandbox ports other than execd's and the
	// egress API's (always watch.Token): watch.Public (the default, also for "") or
	// watch.Token. A sandbox created with secureAccess is token on every port. The data
	// plane learns the modes through the watch (watch.Access); endpoints of token ports
	// carry the access token in their headers.
	DefaultAccess watch.AccessMode
	// Hub receives every change for the data plane; New makes one when nil.
	Hub *watch.Hub
	// PublicAddr is the host[:port] clients use to reach this server, for endpoints;
	// empty means the Host of the request asking for the endpoint.
	PublicAddr string
	// Endpoint, when set, builds endpoints instead of the server proxy default (the
	// gateway installs its own). It may return ServerProxyEndpoint for serverProxy.
	Endpoint EndpointFunc
	// Limits bounds create requests.
	Limits Limits
	// MaxSignedURLLifetime caps how far in the future a signed endpoint may expire
	// (GET /sandboxes/{id}/endpoints/{port}?expires=<Unix seconds>): a later expiry is
	// 400. Zero or negative means DefaultMaxSignedURLLifetime (24 h).
	MaxSignedURLLifetime time.Duration
	// Library holds the operator's named policies (GET /v1/policies; sandboxes name one
	// with the create extension ExtPolicy or PUT /v1/sandboxes/{id}/policy?name=); nil
	// means none. DefaultPolicy, when set, names the library policy of sandboxes created
	// with neither a networkPolicy nor a name (it must be in the library at create).
	Library       PolicyLibrary
	DefaultPolicy string
	// Pools are the warm pools (see PoolSpec); none by default.
	Pools []PoolSpec
	// ImageAliases maps an image reference a client asks for to the local image that
	// serves it (airlock up ships "opensandbox/code-interpreter:latest" →
	// "airlock/code-interpreter:latest", so the OpenSandbox SDKs' defaults resolve
	// without a registry). The sandbox keeps reporting the reference the client asked
	// for. A reference is resolved once: aliases do not chain.
	ImageAliases map[string]string
	// ExecdPort is execd's port inside the sandbox; default opensandbox.ExecdPort.
	ExecdPort int
	// ReadyTimeout is how long a new sandbox may take to answer execd /ping before it is
	// marked Failed; default 120 s.
	ReadyTimeout time.Duration
	// ReapInterval is how often expiry is checked; default 1 s. ResyncInterval is how
	// often the registry is compared with the runtime's containers; default 10 s.
	ReapInterval, ResyncInterval time.Duration
	// TerminatedRetention is how long a sandbox whose container vanished stays listed
	// as Terminated; default 1 h.
	TerminatedRetention time.Duration
	// Registry receives the metrics (namespace airlock, subsystem lifecycle); nil means
	// none are registered.
	Registry prometheus.Registerer
	// ReadyGate, when set, must also report true before a new sandbox moves from
	// Pending to Running (airlock up: egressd enforces its policy), so that nothing a
	// client runs through execd precedes enforcement. A sandbox whose gate stays shut
	// for ReadyTimeout is Failed.
	ReadyGate func(id string) bool
	// PolicyGate, when set, reports whether the data plane enforces version (or a
	// later one) of a sandbox's policy. A policy change through the API answers only
	// once the gate confirms it (at most PolicyApplyTimeout, default 5 s, for a
	// Running sandbox), so the client's next command already meets the new policy.
	PolicyGate         func(id string, version uint64) bool
	PolicyApplyTimeout time.Duration
	// DefaultEnv is added to every new sandbox's environment, under names the create
	// request does not set (airlock up: HTTP_PROXY / HTTPS_PROXY of egressd's explicit
	// proxy when it runs).
	DefaultEnv map[string]string
	// CredentialVault, when set, serves /credential-vault on the egress API and lets
	// sandboxes be created with credentialProxy.enabled (their TCP 80/443 is intercepted
	// by egressd, which holds the vault); nil answers such creates 400.
	CredentialVault CredentialVault
	// Audit receives a record (source policy) for every policy change; nil means none.
	Audit interface{ Append(audit.Record) }
	// AgentActions configures the records of agent actions through execd that the
	// server proxy writes to Audit (package audit/execdaudit; on unless disabled).
	AgentActions execdaudit.Config
	// NodeGroups, when set, names the process group of the commands the server proxy
	// records where lifecycle has no view of the sandbox's /proc (no init pid: a pod on
	// Kubernetes): the egressd of the sandbox's node (record HostIP) watches for it
	// (execdaudit.GroupsPath). Nil: such commands name no group.
	NodeGroups *execdaudit.RemoteGroups
	// AuditDir is the audit log's directory, read by GET /v1/sandboxes/{id}/audit;
	// empty answers that route 501.
	AuditDir string
	// Floor is the operator overlay the data plane compiles every sandbox policy under
	// (airlock up: egressd's, policies.BaseOverlay plus this host's addresses and
	// egress.deny): a policy proposal (GET /sandboxes/{id}/policy/proposal) never holds
	// a rule for what it always denies. Nil: policies.BaseOverlay().
	Floor *policies.Overlay
	// Diagnostics bounds the diagnostics API (GET /sandboxes/{id}/diagnostics/logs and
	// /events, docs/spec/diagnostic-api.yml): payload size, inline size, download URL
	// lifetime. The runtime's logs and events come from its Diagnoser methods.
	Diagnostics DiagnosticsConfig
	// Snapshots bounds snapshots (count and bytes, per source sandbox and in all).
	// Snapshots need a runtime that is a Snapshotter and a store that is a
	// SnapshotStore (Docker with boltstore); elsewhere the snapshot routes answer 501.
	Snapshots SnapshotLimits
	Log       *slog.Logger
}

// Server is the lifecycle server. New builds it; Start reconciles and starts the
// background loops; Handler serves the API; Close stops the loops.
//
// Server owns the sandbox registry and drives the runtime (create, delete, pause,
// resume, readiness, expiry, reconcile, warm pools). The policy, policy library, vault
// and audit APIs and the server proxy are types of their own (policyAPI, libraryAPI,
// vaultAPI, auditAPI, serverProxy) that reach the registry through small interfaces;
// their routes are mounted on the Server's mux.
type Server struct {
	cfg      Config
	log      *slog.Logger
	rt       Runtime
	store    StateStore
	hub      *watch.Hub
	instance string
	mux      *http.ServeMux
	ping     *http.Client
	metrics  *metrics
	// keys authenticates API keys (principals); auth is false without authentication
	// (no APIKey: --no-auth).
	keys *principal.Keyring
	auth bool
	// rules decide the access mode of sandbox ports; lib resolves library policies.
	rules accessRules
	lib   *policyLibrary
	// policies serves the policy routes and the egress API behind the server proxy
	// (port 18080); proxy is the server proxy.
	policies *policyAPI
	proxy    *serverProxy

	mu  sync.Mutex
	sbx map[string]*entry
	// snaps holds the snapshots (guarded by mu).
	snaps snapshots
	pools []*pool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// entry is one sandbox in memory: its record (guarded by Server.mu) and the lock held by
// whichever operation drives the runtime for it.
type entry struct {
	op  sync.Mutex
	rec *record
}

// New checks cfg and returns a Server; it performs no I/O besides reading the store's
// instance id and the API keys (Config.Keys).
func New(cfg Config) (*Server, error) {
	if cfg.Runtime == nil || cfg.Store == nil {
		return nil, errors.New("lifecycle: Runtime and Store are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Hub == nil {
		cfg.Hub = watch.NewHub(0, cfg.Log)
	}
	if cfg.ExecdPort == 0 {
		cfg.ExecdPort = opensandbox.ExecdPort
	}
	if cfg.PolicyApplyTimeout <= 0 {
		cfg.PolicyApplyTimeout = 5 * time.Second
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 120 * time.Second
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 10 * time.Second
	}
	if cfg.TerminatedRetention <= 0 {
		cfg.TerminatedRetention = time.Hour
	}
	if cfg.MaxSignedURLLifetime <= 0 {
		cfg.MaxSignedURLLifetime = DefaultMaxSignedURLLifetime
	}
	switch cfg.DefaultAccess {
	case "":
		cfg.DefaultAccess = watch.Public
	case watch.Public, watch.Token:
	default:
		return nil, fmt.Errorf("lifecycle: default access %q: want public or token", cfg.DefaultAccess)
	}
	if len(cfg.ExecdKey) == 0 {
		cfg.ExecdKey = execdtoken.NewKey()
	}
	cfg.Limits.setDefaults()
	cfg.Diagnostics.setDefaults()
	cfg.Snapshots.setDefaults()
	pools, err := newPools(cfg.Pools, cfg.Limits, cfg.ImageAliases)
	if err != nil {
		return nil, err
	}
	inst, err := cfg.Store.InstanceID()
	if err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	if cfg.Keys == nil {
		cfg.Keys, _ = cfg.Store.(principal.Store)
	}
	if _, shared := cfg.Store.(SharedStore); shared && cfg.KeyRefresh <= 0 {
		cfg.KeyRefresh = 500 * time.Millisecond
	}
	keys, err := principal.NewKeyring(cfg.Keys, cfg.APIKey, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		keys:     keys,
		auth:     cfg.APIKey != "",
		cfg:      cfg,
		log:      cfg.Log,
		rt:       cfg.Runtime,
		store:    cfg.Store,
		hub:      cfg.Hub,
		instance: inst,
		sbx:      map[string]*entry{},
		pools:    pools,
		lib:      &policyLibrary{lib: cfg.Library, log: cfg.Log},
		rules:    accessRules{execdPort: cfg.ExecdPort, fallback: cfg.DefaultAccess},
		ctx:      ctx,
		cancel:   cancel,
		ping: &http.Client{
			Timeout:   2 * time.Second,
			Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, DisableKeepAlives: true},
		},
	}
	s.metrics = newMetrics(cfg.Registry, s)
	s.snaps = snapshots{limits: cfg.Snapshots, byID: map[string]*snapshotRecord{}}
	if sr, ok := cfg.Runtime.(Snapshotter); ok {
		if sc, ok := sr.(SnapshotChecker); ok {
			s.snaps.off = sc.CanSnapshot()
		}
		if s.snaps.off == nil {
			s.snaps.rt = sr
		}
	}
	if ss, ok := cfg.Store.(SnapshotStore); ok {
		s.snaps.store = ss
	}
	s.policies = &policyAPI{
		reg: s, lib: s.lib, vault: &vaultAPI{vault: cfg.CredentialVault, reg: s, log: cfg.Log},
		audit: cfg.Audit, gate: cfg.PolicyGate, timeout: cfg.PolicyApplyTimeout, log: cfg.Log,
	}
	s.proxy = &serverProxy{
		reg: s, rules: s.rules, keys: keys, auth: cfg.APIKey != "", gatewayKey: cfg.GatewayKey, execdKey: cfg.ExecdKey,
		egressAPI: s.policies, audit: cfg.Audit, nodeGroups: cfg.NodeGroups, log: cfg.Log,
	}
	if cfg.Audit != nil {
		s.proxy.agentAudit = execdaudit.New(cfg.Audit, cfg.AgentActions, "server_proxy")
	}
	s.proxy.newProxy()
	s.mux = http.NewServeMux()
	s.routes()
	if cfg.APIKey == "" {
		s.log.Warn("NO API KEY CONFIGURED: the lifecycle API accepts every request without authentication (execd and the egress API behind the server proxy still need the sandbox's access token)")
	}
	return s, nil
}

// InstanceID is the id this server's containers carry (label airlock.dev/instance).
func (s *Server) InstanceID() string { return s.instance }

// Hub returns the watch hub, for consumers in the same process.
func (s *Server) Hub() *watch.Hub { return s.hub }

// Start reconciles the registry with the runtime (adopting this server's containers,
// marking vanished ones Terminated, removing orphans) and starts the reaper. It returns
// once the registry is usable.
//
// With a SharedStore (several replicas), Start loads every replica's sandboxes and
// follows their changes; reconcile and the reaper run only while this replica leads.
func (s *Server) Start(ctx context.Context) error {
	if s.cfg.KeyRefresh > 0 {
		s.wg.Go(func() { s.keys.Follow(s.ctx, s.cfg.KeyRefresh) })
	}
	if shared, ok := s.store.(SharedStore); ok {
		if err := shared.Follow(s.ctx, s.applyRemote); err != nil {
			return fmt.Errorf("lifecycle: following the shared store: %w", err)
		}
		if err := s.load(); err != nil {
			return fmt.Errorf("lifecycle: %w", err)
		}
		s.wg.Go(func() { shared.Lead(s.ctx, s.lead) })
		return nil
	}
	if err := s.reconcile(ctx); err != nil {
		return fmt.Errorf("lifecycle: reconcile: %w", err)
	}
	if err := s.loadSnapshots(ctx); err != nil {
		return fmt.Errorf("lifecycle: snapshots: %w", err)
	}
	s.metrics.leader.Set(1)
	s.wg.Go(func() { s.reapLoop(s.ctx) })
	for _, p := range s.pools {
		s.wg.Go(func() { s.poolLoop(s.ctx, p) })
	}
	return nil
}

// lead runs while this replica leads: it reconciles the registry with the runtime
// (adopting every warm pool member in the store), keeps the warm pools filled, and
// reaps and resyncs until ctx ends (leadership lost). With replicas the leader alone
// holds the pools, so only creates it serves can claim a member; on losing the lead
// it forgets its members, which the next leader adopts.
func (s *Server) lead(ctx context.Context) {
	s.metrics.leader.Set(1)
	defer s.metrics.leader.Set(0)
	s.log.Info("leading: this replica runs expiry, resync, reconcile and the warm pools")
	if err := s.reconcile(ctx); err != nil {
		s.log.Error("reconcile failed", "err", err)
	}
	for _, p := range s.pools {
		s.wg.Go(func() { s.poolLoop(ctx, p) })
	}
	s.reapLoop(ctx)
	s.mu.Lock()
	for _, p := range s.pools {
		p.ready = nil
	}
	s.mu.Unlock()
	s.log.Info("no longer leading")
}

// Close stops the background loops and waits for them; it does not touch sandboxes.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// Handle mounts h at pattern (net/http.ServeMux syntax, without /v1: it is served at
// both) behind the server's authentication and request-id handling. Other components
// (the egress policy API) add their routes this way before the server is serving.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the HTTP handler of the whole API. With Config.Audit set, every
// mutating call and every refusal it answers is a control-plane record (source
// control; control.go).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := r.Header.Get(opensandbox.HeaderRequestID)
		if rid == "" || len(rid) > 128 {
			rid = newRequestID()
			r.Header.Set(opensandbox.HeaderRequestID, rid)
		}
		w.Header().Set(opensandbox.HeaderRequestID, rid)
		if p := r.URL.Path; p == "/v1" || strings.HasPrefix(p, "/v1/") {
			r.URL.Path = strings.TrimPrefix(p, "/v1")
			if r.URL.RawPath != "" {
				r.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, "/v1")
			}
			if r.URL.Path == "" {
				r.URL.Path = "/"
			}
		}
		// The server proxy authenticates itself (admitProxy): it also takes the sandbox's
		// access token, and it guards execd and the egress API even without an API key.
		// A diagnostics download URL carries its own signature (diagnosticsAPI.download).
		exempt := (r.Method == http.MethodGet && r.URL.Path == "/health") || s.isProxyRoute(r) || isDiagnosticDownload(r)
		start := time.Now()
		p, ok := s.authenticate(r)
		if !ok && !exempt {
			s.recordRefusal(r, principal.Principal{}, ErrUnauthorized, start)
			fail(s.log, w, r, ErrUnauthorized)
			return
		}
		if ok {
			r = r.WithContext(principal.NewContext(r.Context(), p))
			s.catchUp(r)
		}
		if !exempt {
			if err := s.authorize(r, p); err != nil {
				s.recordRefusal(r, p, err, start)
				fail(s.log, w, r, err)
				return
			}
		}
		// Mutating calls (and refusals, above) are control-plane records (control.go).
		s.recordControl(w, r, s.mux.ServeHTTP)
	})
}

// Keys returns the API keys (principals) this server admits, for components in the
// same process (the console signs in with them).
func (s *Server) Keys() *principal.Keyring { return s.keys }

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
