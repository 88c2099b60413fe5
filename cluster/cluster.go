// Package cluster assembles Airlock's control plane on Kubernetes: the lifecycle server
// with the Kubernetes runtime (lifecycle/kube) and the cluster store
// (lifecycle/kubestore), its HTTP API with the operator console in front
// (ConsoleConfig), the policy library and metrics. `airlock
// lifecycle` runs one replica; any number of replicas serve the same sandboxes, one of
// them leading (a Lease) for expiry and reconcile. The gateway and egressd run as their
// own workloads and follow this API's watch stream.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/kubestore"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies/library"
)

// Config configures one control-plane replica. `airlock lifecycle`'s flags fill it and
// show the defaults, which DefaultConfig holds; a setting left empty in a Go literal
// gets its default in Start. The fields without a YAML key come from the environment
// (secrets, the Kubernetes client) or are injected.
type Config struct {
	// Listen is the API's address; default ":8080".
	Listen string `yaml:"listen"`
	// Namespace runs the sandbox pods; default airlock-sandboxes. SystemNamespace holds
	// the store (Sandbox and Policy resources, access-token Secrets, the Lease) and the
	// components; default airlock-system (`airlock lifecycle`: $POD_NAMESPACE first).
	Namespace       string `yaml:"namespace"`
	SystemNamespace string `yaml:"systemNamespace"`
	// TokenNamespace holds the access-token Secrets (kubestore.Config.SecretNamespace);
	// default SystemNamespace. Give it a namespace of its own (the deploy manifests:
	// airlock-tokens) so that lifecycle's Role lists and watches those Secrets without
	// any Secret access in the system namespace, where the API key Secret is.
	TokenNamespace string `yaml:"tokenNamespace"`
	// Provider is the sandbox workload: pod (the default) or agent-sandbox (the
	// kubernetes-sigs/agent-sandbox Sandbox resource).
	Provider string `yaml:"provider"`
	// ExecdImage carries the static execd for the init container; default
	// airlock/execd:<version> (kube.Config).
	ExecdImage string `yaml:"execdImage"`
	// ExecdClaim names the PersistentVolumeClaim (in Namespace) holding the node's
	// execd: sandbox pods then start without the execd init container (kube.Config).
	// Empty: the init container.
	ExecdClaim string `yaml:"execdClaim"`
	// RuntimeClassName of sandbox pods (gvisor, kata); empty: the cluster's default.
	RuntimeClassName string `yaml:"runtimeClassName"`
	// DNS is the sandboxes' resolver: egressd's node-local DNS address; default
	// [169.254.20.10] (egressd.DefaultLocalDNS).
	DNS []netip.Addr `yaml:"dns"`
	// L7Port is the port of egressd's transparent L7 proxy on the DNS addresses (its
	// --l7-port): each sandbox's NetworkPolicy admits TCP to it there, where the node
	// redirects the sandbox's checked connections. 0: egressd runs no proxy.
	L7Port uint16 `yaml:"l7Port"`
	// Deny are the cluster's own ranges (pods, Services, nodes) that no sandbox's
	// NetworkPolicy admits whatever its policy allows (kube.Config.Deny); give egressd's
	// --deny the same. Default none.
	Deny []netip.Prefix `yaml:"deny"`
	// AllowedHostRoots are the node directories under which host-path volumes may be
	// mounted; default none (host volumes refused).
	AllowedHostRoots []string `yaml:"allowedHostRoots"`
	// MaxPTYSessions caps the interactive terminals (execd PTY sessions) each sandbox
	// holds open at once (over it, POST /pty answers 409 PTY_LIMIT_EXCEEDED); default 0:
	// execd's own (16); negative: no limit.
	MaxPTYSessions int `yaml:"maxPTYSessions"`
	// Gateway is the gateway's public host[:port] for endpoints, BaseDomain selects the
	// host form (<port>-<id>.<BaseDomain>). Empty Gateway (the default): endpoints point
	// at this server's proxy.
	Gateway    string `yaml:"gateway"`
	BaseDomain string `yaml:"baseDomain"`
	// DefaultAccess of user ports: public (the default) or token; execd and the egress
	// API always need the token.
	DefaultAccess watch.AccessMode `yaml:"defaultAccess"`
	// PolicyDir is the policy library (a mounted ConfigMap); DefaultPolicy names the
	// policy of sandboxes created without one. Empty PolicyDir (the default): no
	// library.
	PolicyDir     string `yaml:"policyDir"`
	DefaultPolicy string `yaml:"defaultPolicy"`
	// EgressdPort is where the egressd of every node serves its enforcement status
	// (watch.EnforcedPath, on its --metrics-listen at the node's address): a new
	// sandbox's entrypoint is released, and a policy change answered, only once the
	// node's egressd enforces it. Default 9102; 0 disables the gate (a cluster without
	// egressd; tests).
	EgressdPort int `yaml:"egressdPort"`
	// Pools are warm pools (lifecycle.PoolSpec; `airlock lifecycle --pool`): held pods,
	// enforced deny-all, that a matching create claims with its own policy enforced
	// before the entrypoint starts. The leading replica holds them (it creates, adopts
	// and claims members); a create another replica serves is created cold. Default
	// none.
	Pools []lifecycle.PoolSpec `yaml:"pools"`
	// Vault serves the Credential Vault (credentialProxy sandboxes): each sandbox's vault
	// lives in its node's egressd (`airlock egressd --vault-dir`), which this replica
	// reaches at EgressdPort with the API key (nodeVault). Needs EgressdPort and an
	// APIKey; default off (a create with credentialProxy is then refused).
	Vault bool `yaml:"vault"`
	// Snapshots serves snapshots and restore: the egressd of a sandbox's node
	// (`airlock egressd --containerd-socket`), reached at EgressdPort with the APIKey,
	// commits the pod's container into an image kept on that node (kube.SnapshotConfig);
	// the records live in TokenNamespace (kubestore). Needs EgressdPort and an APIKey;
	// default off (the snapshot routes answer 501).
	Snapshots bool `yaml:"snapshots"`
	// Identity names this replica in the Lease (`airlock lifecycle`: default $POD_NAME,
	// then the host name); LeaseDuration is how long a stopped leader's Lease blocks a
	// takeover, default 15s.
	Identity      string        `yaml:"identity"`
	LeaseDuration time.Duration `yaml:"leaseDuration"`
	// LeaderService names a Service without a selector in SystemNamespace that the
	// leading replica points at AdvertiseAddress (this replica's pod IP) and the
	// Listen port, through an EndpointSlice of the same name, while it leads
	// (kubestore.LeaderEndpoint): the data plane follows the watch stream there, so it
	// learns what the leader publishes (a warm pool claim) before the store write.
	// Empty, or no AdvertiseAddress: nothing is published.
	LeaderService    string     `yaml:"leaderService"`
	AdvertiseAddress netip.Addr `yaml:"advertiseAddress"`
	// Limits, timeouts and loop intervals have lifecycle.Config's meanings; zero:
	// lifecycle's defaults (a 24h longest timeout, 120s to become ready).
	Limits       lifecycle.Limits `yaml:"-"`
	ReadyTimeout time.Duration    `yaml:"readyTimeout"`
	// Console is the operator console served under /console/ on the API listener
	// (ConsoleConfig); default on.
	Console ConsoleConfig `yaml:"console"`
	// MaxSignedURLLifetime caps ?expires= of signed endpoints (lifecycle's default 24h).
	MaxSignedURLLifetime time.Duration `yaml:"maxSignedURLLifetime"`
	ReapInterval         time.Duration `yaml:"-"`
	ResyncInterval       time.Duration `yaml:"-"`

	// APIKey is the OPEN-SANDBOX-API-KEY clients must send; empty only with NoAuth.
	APIKey string `yaml:"-"`
	NoAuth bool   `yaml:"-"`
	// GatewayKey is the key the gateways send for sandbox port 18080 (the egress API,
	// answered here); empty: such requests need the sandbox's token.
	GatewayKey string `yaml:"-"`
	// ExecdKey derives every sandbox's execd token (lifecycle.Config.ExecdKey); every
	// replica and gateway must use the same. Empty: derived from the API key
	// (execdtoken.FromAPIKey; with NoAuth a random key per replica). airlock lifecycle:
	// $AIRLOCK_EXECD_KEY.
	ExecdKey execdtoken.Key `yaml:"-"`
	// SigningKeys mint signed endpoints (the first is the active one); the gateways
	// verify with the same keys.
	SigningKeys []signedurl.Key `yaml:"-"`
	// Kube is the API server's client configuration (in-cluster or a kubeconfig).
	Kube *rest.Config `yaml:"-"`
	// Audit receives this replica's control-plane records: a record (source control)
	// for every mutating API or console call and refusal, key management and console
	// sign-ins, the policy versions (source policy) and the agent actions through the
	// server proxy (source execd, entry server_proxy), each with its principal
	// (lifecycle.Config.Audit). airlock lifecycle --audit-dir: a signed chain of its own
	// per replica (stack.OpenAudit). nil: none, and sign-ins are only logged.
	Audit interface{ Append(audit.Record) } `yaml:"-"`
	// AgentActions configures the agent-action records written to Audit
	// (execdaudit.Config: on unless disabled, command text or its SHA-256).
	AgentActions execdaudit.Config `yaml:"-"`
	// Registry receives the metrics; nil: a new registry.
	Registry *prometheus.Registry `yaml:"-"`
	// Log is the replica's logger; nil discards.
	Log *slog.Logger `yaml:"-"`
}

// DefaultConfig is every default of a control-plane replica (the flags of `airlock
// lifecycle` show them).
func DefaultConfig() Config {
	return Config{
		Listen:          ":8080",
		Namespace:       "airlock-sandboxes",
		SystemNamespace: "airlock-system",
		Provider:        "pod",
		DNS:             []netip.Addr{netip.MustParseAddr("169.254.20.10")},
		DefaultAccess:   watch.Public,
		EgressdPort:     9102,
		LeaseDuration:   15 * time.Second,
	}
}

// resolved is c with the settings a Go literal leaves empty filled from DefaultConfig
// (EgressdPort 0 stays off).
func (c Config) resolved() Config {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.Provider == "" {
		c.Provider = d.Provider
	}
	if c.DefaultAccess == "" {
		c.DefaultAccess = d.DefaultAccess
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = d.LeaseDuration
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	return c
}

// ControlPlane is one running replica.
type ControlPlane struct {
	Server  *lifecycle.Server
	Store   *kubestore.Store
	Runtime *kube.Runtime
	// Addr is where the API listens.
	Addr net.Addr

	http     *http.Server
	lib      *library.Library
	stopLib  context.CancelFunc
	libDone  chan struct{}
	log      *slog.Logger
	closeErr error
}

// Start builds and starts a replica: the store syncs, the registry loads, the API
// listens. It returns once requests are served.
func Start(ctx context.Context, cfg Config) (*ControlPlane, error) {
	if cfg.Kube == nil || cfg.Namespace == "" || cfg.SystemNamespace == "" {
		return nil, errors.New("cluster: Kube, Namespace and SystemNamespace are required")
	}
	if cfg.APIKey == "" && !cfg.NoAuth {
		return nil, errors.New("cluster: an API key is required (OPEN_SANDBOX_API_KEY); NoAuth only for tests")
	}
	cfg = cfg.resolved()
	if len(cfg.ExecdKey) == 0 {
		// The same in every replica and gateway that holds the API key.
		cfg.ExecdKey = execdtoken.FromAPIKey(cfg.APIKey)
	}
	cs, err := kubernetes.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	st, err := kubestore.New(kubestore.Config{
		Client: cs, Dynamic: dyn, Namespace: cfg.SystemNamespace, SecretNamespace: cfg.TokenNamespace, Identity: cfg.Identity,
		LeaseDuration: cfg.LeaseDuration, Leader: leaderEndpoint(cfg), Log: cfg.Log.With("component", "kubestore"),
	})
	if err != nil {
		return nil, err
	}
	inst, err := st.InstanceID()
	if err != nil {
		return nil, err
	}
	var snaps *kube.SnapshotConfig
	if cfg.Snapshots {
		if cfg.EgressdPort <= 0 || cfg.APIKey == "" {
			return nil, errors.New("cluster: snapshots need the nodes' egressd (EgressdPort) and an API key")
		}
		snaps = &kube.SnapshotConfig{EgressdPort: cfg.EgressdPort, APIKey: cfg.APIKey, EgressdNamespace: cfg.SystemNamespace}
	}
	rt, err := kube.New(kube.Config{
		Client: cs, Dynamic: dyn, Namespace: cfg.Namespace, Instance: inst, Provider: cfg.Provider,
		ExecdImage: cfg.ExecdImage, ExecdClaim: cfg.ExecdClaim, RuntimeClassName: cfg.RuntimeClassName, DNS: cfg.DNS, L7Port: cfg.L7Port, Deny: cfg.Deny,
		AllowedHostRoots: cfg.AllowedHostRoots, SystemNamespace: cfg.SystemNamespace, MaxPTYSessions: cfg.MaxPTYSessions,
		Snapshots: snaps,
		Log:       cfg.Log.With("component", "kube"),
	})
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Store: st, Runtime: rt, log: cfg.Log}
	var lib lifecycle.PolicyLibrary
	if cfg.PolicyDir != "" {
		l, err := library.Open(library.Config{Dir: cfg.PolicyDir, Store: st, OnEvent: cp.policyEvent,
			Log: cfg.Log.With("component", "policies")})
		if err != nil {
			return nil, err
		}
		cp.lib, lib = l, l
	}
	var endpoints lifecycle.EndpointFunc
	if cfg.Gateway != "" {
		e := signedurl.Endpoints{Gateway: cfg.Gateway, BaseDomain: cfg.BaseDomain}
		if len(cfg.SigningKeys) > 0 {
			kr, err := signedurl.NewKeyring(cfg.SigningKeys[0].ID, cfg.SigningKeys...)
			if err != nil {
				return nil, err
			}
			e.Keys = kr
		}
		endpoints = func(er lifecycle.EndpointRequest) (string, error) {
			ep, err := e.For(er.ID, er.Port, er.ServerProxy, er.Expires, er.SignedEpoch)
			if err != nil {
				return "", fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
			}
			return ep, nil
		}
	}
	var readyGate func(string) bool
	var policyGate func(string, uint64) bool
	var credVault lifecycle.CredentialVault
	var nodeGroups *execdaudit.RemoteGroups
	if cfg.EgressdPort > 0 {
		// The server proxy's command records get their process group from the node
		// (lifecycle has no view of a pod's /proc).
		nodeGroups = execdaudit.NewRemoteGroups(cfg.EgressdPort, cfg.APIKey, cfg.Log.With("component", "agent-audit"))
		g := newEnforcementGate(cs, cfg.Namespace, cfg.EgressdPort)
		readyGate, policyGate = g.ready, g.policy
		if cfg.Vault {
			v := newNodeVault(g, cfg.APIKey, cfg.Log.With("component", "vault"))
			// The node has the sandbox's CA before the entrypoint starts.
			readyGate = func(id string) bool { return v.install(id) && g.ready(id) }
			credVault = v
		}
	}
	srv, err := lifecycle.New(lifecycle.Config{
		Runtime: rt, Store: st, APIKey: cfg.APIKey, GatewayKey: cfg.GatewayKey, ExecdKey: cfg.ExecdKey,
		DefaultAccess: cfg.DefaultAccess, Endpoint: endpoints,
		Limits:  cfg.Limits,
		Library: lib, DefaultPolicy: cfg.DefaultPolicy,
		ReadyTimeout: cfg.ReadyTimeout, ReapInterval: cfg.ReapInterval, ResyncInterval: cfg.ResyncInterval,
		MaxSignedURLLifetime: cfg.MaxSignedURLLifetime,
		Pools:                cfg.Pools,
		ReadyGate:            readyGate, PolicyGate: policyGate,
		CredentialVault: credVault, NodeGroups: nodeGroups,
		Audit: cfg.Audit, AgentActions: cfg.AgentActions,
		Registry: cfg.Registry, Log: cfg.Log.With("component", "lifecycle"),
	})
	if err != nil {
		return nil, err
	}
	cp.Server = srv
	srv.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	if cp.lib != nil {
		lctx, cancel := context.WithCancel(context.Background())
		cp.stopLib, cp.libDone = cancel, make(chan struct{})
		go func() {
			defer close(cp.libDone)
			if err := cp.lib.Run(lctx); err != nil {
				cfg.Log.Error("policy library watch stopped", "err", err)
			}
		}()
	}
	handler, closeConsole, err := apiHandler(cfg, srv.Handler(), srv.Keys().Authenticate)
	if err != nil {
		cp.stopLibrary()
		srv.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		cp.stopLibrary()
		srv.Close()
		return nil, err
	}
	cp.Addr = ln.Addr()
	cp.http = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 620 * time.Second}
	cp.http.RegisterOnShutdown(closeConsole)
	go func() {
		if err := cp.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error("api listener failed", "err", err)
		}
	}()
	cfg.Log.Info("lifecycle replica serving", "addr", cp.Addr.String(), "identity", st.Identity(),
		"namespace", cfg.Namespace, "store", cfg.SystemNamespace, "provider", cfg.Provider)
	return cp, nil
}

// policyEvent republishes the sandboxes of a named policy that got a new version.
func (cp *ControlPlane) policyEvent(ev library.Event) {
	if ev.Applied && cp.Server != nil {
		n := cp.Server.NamedPolicyChanged(ev.Name)
		cp.log.Info("named policy republished", "policy", ev.Name, "version", ev.Policy.Version, "sandboxes", n)
	}
}

// stopLibrary stops the policy library's watch, if it runs.
func (cp *ControlPlane) stopLibrary() {
	if cp.stopLib != nil {
		cp.stopLib()
		<-cp.libDone
		cp.stopLib = nil
	}
}

// Close stops serving and the background loops (releasing the Lease); sandboxes keep
// running.
func (cp *ControlPlane) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if cp.http != nil {
		if err := cp.http.Shutdown(ctx); err != nil {
			errs = append(errs, cp.http.Close())
		}
	}
	cp.stopLibrary()
	errs = append(errs, cp.Server.Close())
	return errors.Join(errs...)
}

// leaderEndpoint is where cfg's replica is reached while it leads: the Listen port at
// AdvertiseAddress, named by the Identity (the pod's name in the manifests).
func leaderEndpoint(cfg Config) kubestore.LeaderEndpoint {
	if cfg.LeaderService == "" || !cfg.AdvertiseAddress.IsValid() {
		return kubestore.LeaderEndpoint{}
	}
	port := 8080
	if _, p, err := net.SplitHostPort(cfg.Listen); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 {
			port = n
		}
	}
	return kubestore.LeaderEndpoint{Service: cfg.LeaderService, Address: cfg.AdvertiseAddress, Port: port, Pod: cfg.Identity}
}
