// Package cluster assembles Airlock's control plane on Kubernetes: the lifecycle server
// with the Kubernetes runtime (lifecycle/kube) and the cluster store
// (lifecycle/kubestore), its HTTP API, the policy library and metrics. `airlock
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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/kubestore"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies/library"
)

// Config configures one control-plane replica.
type Config struct {
	// Kube is the API server's client configuration (in-cluster or a kubeconfig).
	Kube *rest.Config
	// Listen is the API's address (default ":8080").
	Listen string
	// Namespace runs the sandbox pods; SystemNamespace holds the store (Sandbox and
	// Policy resources, access-token Secrets, the Lease) and the components.
	Namespace, SystemNamespace string
	// Provider, ExecdImage, RuntimeClassName, DNS and AllowedHostRoots configure the
	// runtime (kube.Config).
	Provider, ExecdImage, RuntimeClassName string
	DNS                                    []netip.Addr
	AllowedHostRoots                       []string
	// APIKey is the OPEN-SANDBOX-API-KEY clients must send; empty only with NoAuth.
	APIKey string
	NoAuth bool
	// GatewayKey is the key the gateways send for sandbox port 18080 (the egress API,
	// answered here); empty: such requests need the sandbox's token.
	GatewayKey string
	// Gateway is the gateway's public host[:port] for endpoints, BaseDomain selects the
	// host form, SigningKeys mint signed endpoints (the first is the active one). Empty
	// Gateway: endpoints point at this server's proxy.
	Gateway     string
	BaseDomain  string
	SigningKeys []signedurl.Key
	// DefaultAccess of user ports (public or token).
	DefaultAccess watch.AccessMode
	// PolicyDir is the policy library (a mounted ConfigMap); DefaultPolicy names the
	// policy of sandboxes created without one. Empty PolicyDir: no library.
	PolicyDir, DefaultPolicy string
	// EgressdPort is where the egressd of every node serves its enforcement status
	// (watch.EnforcedPath, on its --metrics-listen at the node's address): a new
	// sandbox's entrypoint is released, and a policy change answered, only once the
	// node's egressd enforces it. 0 disables the gate (a cluster without egressd; tests).
	EgressdPort int
	// Identity names this replica in the Lease; LeaseDuration tunes takeover.
	Identity      string
	LeaseDuration time.Duration
	// Limits, timeouts and loop intervals (lifecycle.Config's meanings; zero: defaults).
	Limits                                     lifecycle.Limits
	ReadyTimeout, ReapInterval, ResyncInterval time.Duration
	Registry                                   *prometheus.Registry
	Log                                        *slog.Logger
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
	if cfg.Listen == "" {
		cfg.Listen = ":8080"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
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
		Client: cs, Dynamic: dyn, Namespace: cfg.SystemNamespace, Identity: cfg.Identity,
		LeaseDuration: cfg.LeaseDuration, Log: cfg.Log.With("component", "kubestore"),
	})
	if err != nil {
		return nil, err
	}
	inst, err := st.InstanceID()
	if err != nil {
		return nil, err
	}
	rt, err := kube.New(kube.Config{
		Client: cs, Dynamic: dyn, Namespace: cfg.Namespace, Instance: inst, Provider: cfg.Provider,
		ExecdImage: cfg.ExecdImage, RuntimeClassName: cfg.RuntimeClassName, DNS: cfg.DNS,
		AllowedHostRoots: cfg.AllowedHostRoots, SystemNamespace: cfg.SystemNamespace,
		Log: cfg.Log.With("component", "kube"),
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
			ep, err := e.For(er.ID, er.Port, er.ServerProxy, er.Expires)
			if err != nil {
				return "", fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
			}
			return ep, nil
		}
	}
	var readyGate func(string) bool
	var policyGate func(string, uint64) bool
	if cfg.EgressdPort > 0 {
		g := newEnforcementGate(cs, cfg.Namespace, cfg.EgressdPort)
		readyGate, policyGate = g.ready, g.policy
	}
	srv, err := lifecycle.New(lifecycle.Config{
		Runtime: rt, Store: st, APIKey: cfg.APIKey, GatewayKey: cfg.GatewayKey,
		DefaultAccess: cfg.DefaultAccess, Endpoint: endpoints,
		Limits:  cfg.Limits,
		Library: lib, DefaultPolicy: cfg.DefaultPolicy,
		ReadyTimeout: cfg.ReadyTimeout, ReapInterval: cfg.ReapInterval, ResyncInterval: cfg.ResyncInterval,
		ReadyGate: readyGate, PolicyGate: policyGate,
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
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		srv.Close()
		return nil, err
	}
	cp.Addr = ln.Addr()
	cp.http = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 620 * time.Second}
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
	if cp.stopLib != nil {
		cp.stopLib()
		<-cp.libDone
	}
	errs = append(errs, cp.Server.Close())
	return errors.Join(errs...)
}
