// Package stack assembles Airlock's components into the one process `airlock up` runs:
// the embedded store, the audit log, the Docker runtime, the lifecycle server and its
// HTTP listener, the ingress gateway (embedded Caddy) and egressd. Components start in
// order and stop in reverse; a failed start stops what had started.
//
// It is also the one place egressd and the gateway are built: NewEgressd and
// NewGateway, with their settings and defaults in EgressdConfig and GatewayConfig, are
// what `airlock up` (filled from airlock.yaml) and the standalone `airlock egressd` and
// `airlock gateway` (filled from flags) run; OpenAudit opens the hash-chained, signed
// audit log of each.
package stack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// component is one part of the stack.
type component struct {
	name  string
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

// Stack is a running (or startable) Airlock.
type Stack struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry

	// Filled as components start.
	Store     *boltstore.Store
	Audit     *audit.Writer
	Docker    *docker.Runtime
	Lifecycle *lifecycle.Server
	Gateway   *Gateway // nil when the gateway is disabled
	Egress    *Egressd // nil when egress enforcement is disabled
	// Vault is the Credential Vault (credentialProxy sandboxes); nil without egress or
	// without the L7 proxy.
	Vault  *vault.Store
	APIKey string
	// Addr is the lifecycle API's bound address.
	Addr net.Addr

	endpoints    atomic.Pointer[signedurl.Endpoints] // set once the gateway runs
	gatewayKey   string                              // see startLifecycle
	execdKey     execdtoken.Key                      // see startLifecycle
	stopEgressFn func()
	// stopPoliciesFn stops the policy library's directory watch.
	stopPoliciesFn func()
	// lifecycleSrv is Lifecycle for the library's watch goroutine (set once started).
	lifecycleSrv atomic.Pointer[lifecycle.Server]
	// Library is the named policies (policies.dir).
	Library    *library.Library
	egress     atomic.Pointer[egressd.Daemon] // for the ready gate (set once egressd runs)
	http       *http.Server
	telemetry  *telemetry // OTLP exports; nil when off
	components []component
	started    []component
}

// New checks cfg and lays out the components; it starts nothing.
func New(cfg Config, log *slog.Logger) (*Stack, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stack{cfg: cfg, log: log, registry: prometheus.NewRegistry()}
	s.components = []component{
		{name: "store", start: s.startStore, stop: func(context.Context) error { return s.Store.Close() }},
		{name: "audit", start: s.startAudit, stop: func(context.Context) error { return s.Audit.Close() }},
		{name: "telemetry", start: s.startTelemetry, stop: s.stopTelemetry},
		{name: "policies", start: s.startPolicies, stop: s.stopPolicies},
		{name: "docker", start: s.startDocker, stop: func(context.Context) error { return s.Docker.Close() }},
		{name: "lifecycle", start: s.startLifecycle, stop: func(context.Context) error { return s.Lifecycle.Close() }},
		{name: "api", start: s.startAPI, stop: s.stopAPI},
	}
	// The data plane follows lifecycle's watch stream, so it starts after the listener.
	if !s.cfg.Gateway.Disabled {
		s.components = append(s.components, component{name: "gateway", start: s.startGateway, stop: s.stopGateway})
	}
	if !s.cfg.Egress.Disabled {
		s.components = append(s.components, component{name: "egress", start: s.startEgress, stop: s.stopEgress})
	}
	return s, nil
}

// StateDir is the state directory in use (the store, the keys, the pid file).
func (s *Stack) StateDir() string { return s.cfg.StateDir }

// Registry is the Prometheus registry every component registers on.
func (s *Stack) Registry() *prometheus.Registry { return s.registry }

// Start starts every component in order; on failure it stops those that started, in
// reverse, and returns the error.
func (s *Stack) Start(ctx context.Context) error {
	for _, c := range s.components {
		t0 := time.Now()
		if err := c.start(ctx); err != nil {
			stopErr := s.Stop(context.WithoutCancel(ctx))
			return errors.Join(fmt.Errorf("starting %s: %w", c.name, err), stopErr)
		}
		s.started = append(s.started, c)
		s.log.Info("component started", "component", c.name, "start_ms", time.Since(t0).Milliseconds())
	}
	return nil
}

// Stop stops the started components in reverse order; safe after a partial start.
func (s *Stack) Stop(ctx context.Context) error {
	var errs []error
	for i := len(s.started) - 1; i >= 0; i-- {
		c := s.started[i]
		if err := c.stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping %s: %w", c.name, err))
		}
	}
	s.started = nil
	return errors.Join(errs...)
}

func (s *Stack) startStore(context.Context) error {
	if err := os.MkdirAll(s.cfg.StateDir, 0o700); err != nil {
		return err
	}
	st, err := boltstore.Open(filepath.Join(s.cfg.StateDir, "lifecycle.db"))
	if err != nil {
		return err
	}
	s.Store = st
	key, err := s.apiKey()
	if err != nil {
		return err
	}
	s.APIKey = key
	if !s.cfg.Egress.Disabled && s.cfg.Egress.L7Port > 0 {
		if s.Vault, err = vault.Open(filepath.Join(s.cfg.StateDir, "vault"), s.log.With("component", "vault")); err != nil {
			return err
		}
		s.Vault.OnChange(s.auditVaultChange)
	}
	return nil
}

// auditVaultChange records an applied Credential Vault change (names only).
func (s *Stack) auditVaultChange(c vault.Change) {
	if s.Audit == nil {
		return
	}
	auditVaultChange(s.Audit, c)
}

// auditVaultChange appends the record of an applied Credential Vault change (names
// only, never values) to sink, when there is one (airlock up's log, or egressd's own
// on Kubernetes).
func auditVaultChange(sink egressd.AuditSink, c vault.Change) {
	if sink == nil {
		return
	}
	sink.Append(audit.Record{Time: time.Now(), SandboxID: c.SandboxID, Source: audit.SourceCredential,
		Action: "allow", Rule: "vault." + c.Op,
		Reason: fmt.Sprintf("credential vault %s applied: revision %d", c.Op, c.Revision),
		Extra:  map[string]any{"credentials": c.Credentials, "bindings": c.Bindings}})
}

// apiKey returns the configured key, the stored one, or a new one it stores.
func (s *Stack) apiKey() (string, error) {
	if s.cfg.NoAuth {
		return "", nil
	}
	if s.cfg.APIKey != "" {
		return s.cfg.APIKey, nil
	}
	p := filepath.Join(s.cfg.StateDir, "api-key")
	if b, err := os.ReadFile(p); err == nil {
		if k := strings.TrimSpace(string(b)); k != "" {
			return k, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading the API key: %w", err)
	}
	var r [24]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	k := "ak_" + base64.RawURLEncoding.EncodeToString(r[:])
	if err := os.WriteFile(p, []byte(k+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("storing the API key: %w", err)
	}
	return k, nil
}

func (s *Stack) startDocker(ctx context.Context) error {
	inst, err := s.Store.InstanceID()
	if err != nil {
		return err
	}
	var subnet, subnet6 netip.Prefix
	if s.cfg.Docker.Subnet != "" {
		subnet = netip.MustParsePrefix(s.cfg.Docker.Subnet)
	}
	if s.cfg.Docker.Subnet6 != "" {
		subnet6 = netip.MustParsePrefix(s.cfg.Docker.Subnet6) // checked by setDefaults
	}
	rt, err := docker.New(docker.Config{
		Instance:         inst,
		Network:          s.cfg.Docker.Network,
		Subnet:           subnet,
		Subnet6:          subnet6,
		ExecdPath:        s.cfg.Docker.ExecdPath,
		OCIRuntime:       s.cfg.Docker.Runtime,
		AllowedHostRoots: s.cfg.Docker.AllowedHostRoots,
		NamePrefix:       s.cfg.Docker.NamePrefix,
		MaxPTYSessions:   s.cfg.Docker.MaxPTYSessions,
		DNSOnGateway:     !s.cfg.Egress.Disabled,
		Log:              s.log.With("component", "docker"),
	})
	if err != nil {
		return err
	}
	s.Docker = rt
	return rt.Setup(ctx)
}

func (s *Stack) startLifecycle(ctx context.Context) error {
	// The gateway forwards admitted egress API requests (sandbox port 18080) to
	// lifecycle's server proxy with this key (lifecycle.Config.GatewayKey): random per
	// start, never stored, accepted nowhere else.
	if !s.cfg.Gateway.Disabled {
		var r [24]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		s.gatewayKey = "gk_" + base64.RawURLEncoding.EncodeToString(r[:])
	}
	// Every sandbox's execd token derives from this key (lifecycle and the gateway),
	// generated once and kept in the state directory so sandboxes outlive restarts.
	var err error
	if s.execdKey, err = execdtoken.LoadOrCreate(filepath.Join(s.cfg.StateDir, "execd-key")); err != nil {
		return err
	}
	// Proposals leave out what egressd's overlay always denies (this host's addresses
	// included), as the console's explain shows it.
	floor := policies.BaseOverlay()
	if !s.cfg.Egress.Disabled {
		if floor, err = s.egressConfig().Overlay(); err != nil {
			return err
		}
	}
	srv, err := lifecycle.New(lifecycle.Config{
		Runtime:       s.Docker,
		Store:         s.Store,
		APIKey:        s.APIKey,
		GatewayKey:    s.gatewayKey,
		ExecdKey:      s.execdKey,
		DefaultAccess: watch.AccessMode(s.cfg.Gateway.DefaultAccess),
		PublicAddr:    s.cfg.PublicAddr,
		Limits: lifecycle.Limits{
			MaxTimeout: time.Duration(s.cfg.Lifecycle.MaxTimeout),
		},
		ReadyTimeout:         time.Duration(s.cfg.Lifecycle.ReadyTimeout),
		MaxSignedURLLifetime: time.Duration(s.cfg.Lifecycle.MaxSignedURLLifetime),
		Snapshots:            lifecycle.SnapshotLimits(s.cfg.Lifecycle.Snapshots),
		ImageAliases:         s.cfg.Images.Aliases,
		Pools:                s.poolSpecs(),
		Library:              s.Library,
		DefaultPolicy:        s.cfg.Policies.Default,
		Endpoint:             s.endpoint,
		Audit:                s.Audit,
		AuditDir:             s.cfg.Audit.Dir,
		Floor:                floor,
		AgentActions:         s.cfg.Audit.AgentActions,
		ReadyGate:            s.readyGate(),
		PolicyGate:           s.policyGate(),
		DefaultEnv:           s.proxyEnv(),
		CredentialVault:      s.credentialVault(),
		Registry:             s.registry,
		Log:                  s.log.With("component", "lifecycle"),
	})
	if err != nil {
		return err
	}
	s.Lifecycle = srv
	s.lifecycleSrv.Store(srv)
	if d := s.cfg.Policies.Default; d != "" {
		if _, ok := s.Library.Get(d); !ok {
			s.log.Warn("policies.default names no policy of the library: creates without a policy fail until it exists", "policy", d, "dir", s.cfg.Policies.Dir)
		}
	}
	srv.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	return srv.Start(ctx)
}

func (s *Stack) startAPI(context.Context) error {
	h, closeConsole, err := s.apiHandler()
	if err != nil {
		return err
	}
	h = s.traceAPI(h)
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return err
	}
	s.Addr = ln.Addr()
	s.http = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       620 * time.Second,
	}
	s.http.RegisterOnShutdown(closeConsole)
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("api listener failed", "err", err)
		}
	}()
	return nil
}

func (s *Stack) stopAPI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		return s.http.Close()
	}
	return nil
}

// credentialVault is s.Vault as lifecycle's interface, nil when there is none.
// The vault copies credentials and bindings for snapshots and restores.
var _ lifecycle.VaultCopier = (*vault.Store)(nil)

func (s *Stack) credentialVault() lifecycle.CredentialVault {
	if s.Vault == nil {
		return nil
	}
	return s.Vault
}

// poolSpecs are the configured warm pools in lifecycle's form (checked by lifecycle.New).
func (s *Stack) poolSpecs() []lifecycle.PoolSpec {
	out := make([]lifecycle.PoolSpec, 0, len(s.cfg.Pools))
	for _, p := range s.cfg.Pools {
		out = append(out, lifecycle.PoolSpec{Name: p.Name, Image: p.Image, Size: p.Size, ResourceLimits: p.ResourceLimits,
			Entrypoint: p.Entrypoint, ReadyPort: p.ReadyPort, ReadyPath: p.ReadyPath})
	}
	return out
}
