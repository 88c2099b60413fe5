package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

func newLifecycleCmd() *cobra.Command {
	var (
		c                                 cluster.Config
		runtimeKind, kubeconfig, logLevel string
		defaultAccess                     string
		dns, signingKeys                  []string
		noAuth                            bool
	)
	cmd := &cobra.Command{
		Use:   "lifecycle",
		Short: "Run the control plane alone on Kubernetes: the lifecycle API with pods as sandboxes and state in the cluster",
		Long: `Runs one replica of Airlock's control plane for a Kubernetes cluster: the OpenSandbox
lifecycle API (also under /v1), the execd and egress API server proxy, and the watch
stream that the gateway (a Deployment: airlock gateway) and egressd (a DaemonSet:
airlock egressd) follow.

Each sandbox is a pod in --namespace (execd from the --execd-image init container, DNS at
the node-local egressd address --dns, a NetworkPolicy as a second layer), or an
agent-sandbox Sandbox resource (--provider agent-sandbox). State lives in the cluster,
in --system-namespace: airlock.dev Sandbox and Policy resources (CRDs in
deploy/kubernetes/base/crds), one Secret per sandbox for its access token, and a Lease.
Any number of replicas serve the same sandboxes; the one holding the Lease runs expiry
and reconcile, and another takes over within --lease-duration when it goes.

Pause and resume answer 501 on Kubernetes. Warm pools and the Credential Vault need
'airlock up' (one host).

Secrets come from the environment: OPEN_SANDBOX_API_KEY (required unless --no-auth),
AIRLOCK_GATEWAY_KEY (what gateways send for sandbox port 18080) and
AIRLOCK_SIGNING_KEYS (comma-separated --signing-key values). In a pod, the Kubernetes
client is configured in-cluster; elsewhere from --kubeconfig or $KUBECONFIG.`,
		Example: `  OPEN_SANDBOX_API_KEY=... airlock lifecycle --namespace airlock-sandboxes \
      --system-namespace airlock-system --gateway sandboxes.example.com --dns 169.254.20.10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runtimeKind != "kubernetes" {
				return fmt.Errorf("--runtime %q: airlock lifecycle runs the Kubernetes runtime; on one host with Docker use 'airlock up'", runtimeKind)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(logLevel)}))
			kc, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			c.Kube, c.Log, c.NoAuth = kc, log, noAuth
			c.APIKey = os.Getenv("OPEN_SANDBOX_API_KEY")
			c.GatewayKey = os.Getenv("AIRLOCK_GATEWAY_KEY")
			if c.APIKey == "" && !noAuth {
				return errors.New("OPEN_SANDBOX_API_KEY is not set: every lifecycle replica needs the API key (--no-auth only for a test cluster)")
			}
			c.DefaultAccess = watch.AccessMode(defaultAccess)
			for _, s := range dns {
				a, err := netip.ParseAddr(s)
				if err != nil {
					return fmt.Errorf("--dns %q: %w", s, err)
				}
				c.DNS = append(c.DNS, a)
			}
			if len(signingKeys) == 0 {
				if env := os.Getenv("AIRLOCK_SIGNING_KEYS"); env != "" {
					signingKeys = strings.Split(env, ",")
				}
			}
			for _, spec := range signingKeys {
				k, err := signedurl.ParseKey(spec)
				if err != nil {
					return fmt.Errorf("signing key: %w", err)
				}
				c.SigningKeys = append(c.SigningKeys, k)
			}
			if c.Identity == "" {
				c.Identity = os.Getenv("POD_NAME")
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			c.Registry = reg
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cp, err := cluster.Start(ctx, c)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "airlock lifecycle: serving on %s (sandboxes in %s, state in %s)\n", cp.Addr, c.Namespace, c.SystemNamespace)
			<-ctx.Done()
			log.Info("stopping: releasing the Lease; sandboxes keep running")
			return cp.Close()
		},
	}
	f := cmd.Flags()
	f.StringVar(&runtimeKind, "runtime", "kubernetes", "the runtime; only kubernetes (one host with Docker: airlock up)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file outside a pod (default $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&c.Listen, "listen", ":8080", "address of the lifecycle API")
	f.StringVar(&c.Namespace, "namespace", "airlock-sandboxes", "namespace of the sandbox pods")
	f.StringVar(&c.SystemNamespace, "system-namespace", envOr("POD_NAMESPACE", "airlock-system"), "namespace of the state (Sandbox and Policy resources, token Secrets, the Lease); env POD_NAMESPACE")
	f.StringVar(&c.Provider, "provider", "pod", "sandbox workload: pod, or agent-sandbox (the kubernetes-sigs/agent-sandbox Sandbox resource)")
	f.StringVar(&c.ExecdImage, "execd-image", "", "image carrying the static execd for the init container (default airlock/execd:<version>)")
	f.StringVar(&c.RuntimeClassName, "runtime-class", "", "runtimeClassName of sandbox pods (gvisor, kata); empty: the cluster's default")
	f.StringSliceVar(&dns, "dns", []string{"169.254.20.10"}, "the sandboxes' resolver: egressd's node-local DNS address")
	f.StringSliceVar(&c.AllowedHostRoots, "allowed-host-root", nil, "node directories under which host-path volumes may be mounted (none: host volumes refused)")
	f.StringVar(&c.Gateway, "gateway", "", "the gateway's public host[:port] for endpoints (empty: this server's proxy)")
	f.StringVar(&c.BaseDomain, "base-domain", "", "host-form endpoints <port>-<id>.<base domain> (a wildcard DNS name pointing at the gateway)")
	f.StringSliceVar(&signingKeys, "signing-key", nil, "ID=base64:SECRET key to mint signed endpoints (also AIRLOCK_SIGNING_KEYS); the gateways verify with the same keys")
	f.StringVar(&defaultAccess, "default-access", "public", "admission of user ports: public or token (execd and the egress API always need the token)")
	f.StringVar(&c.PolicyDir, "policy-dir", "", "the policy library directory (a mounted ConfigMap); empty: no named policies")
	f.StringVar(&c.DefaultPolicy, "default-policy", "", "named policy of sandboxes created without one")
	f.IntVar(&c.EgressdPort, "egressd-port", 9102, "port of every node's egressd status route (its --metrics-listen on the node address): entrypoints start and policy changes answer once it enforces them; 0: no gate (no egressd)")
	f.StringVar(&c.Identity, "identity", "", "this replica's name in the Lease (default $POD_NAME, then the host name)")
	f.DurationVar(&c.LeaseDuration, "lease-duration", 15*time.Second, "how long a stopped leader's Lease blocks a takeover")
	f.DurationVar(&c.Limits.MaxTimeout, "max-timeout", 0, "longest sandbox timeout a create may ask for (default lifecycle's)")
	f.DurationVar(&c.ReadyTimeout, "ready-timeout", 0, "how long a pod may take to run and answer execd /ping (default 120s)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&noAuth, "no-auth", false, "serve without an API key (a test cluster only)")
	return cmd
}

// kubeConfig is the in-cluster configuration in a pod, else the kubeconfig file.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: not in a pod and no usable kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config): %w", err)
	}
	return c, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
