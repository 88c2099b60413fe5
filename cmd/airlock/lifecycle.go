package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/stack"
)

// lifecycleFlags are the flags of `airlock lifecycle`: they fill a cluster.Config and
// show its defaults (cluster.DefaultConfig).
type lifecycleFlags struct {
	cfg                               cluster.Config
	runtimeKind, kubeconfig, logLevel string
	dns, signingKeys, pools, deny     []string
	advertise                         string
	audit                             stack.AuditConfig
}

func newLifecycleCmd() *cobra.Command { return lifecycleCommand(&lifecycleFlags{}) }

func lifecycleCommand(lf *lifecycleFlags) *cobra.Command {
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
deploy/kubernetes/base/crds) and a Lease; one Secret per sandbox for its access token
in --token-namespace (default the system namespace).
Any number of replicas serve the same sandboxes; the one holding the Lease runs expiry
and reconcile, and another takes over within --lease-duration when it goes.

The operator console (the web UI of airlock up) is served under /console/ on the same
listener (--no-console: none): an operator signs in with any API key. A session lives
in the memory of the replica that signed it in (the manifests' Services keep a client
on one replica: sessionAffinity ClientIP; a restarted replica signs its sessions out),
and the console has no audit pages here (the audit is spread over each node's egressd,
the gateways and every lifecycle replica): they answer 501.

With --audit-dir, the replica writes its control-plane records to a hash-chained audit
log of its own there, as 'airlock up' does: every mutating API or console call and every
refusal (create, delete, renew, pause, policy put/patch, vault, key management,
signed-URL minting) with its principal, console sign-ins, policy versions, and the
agent actions through its execd server proxy (--audit-agent-actions). Every checkpoint
is signed with an Ed25519 key, <audit-dir>.key beside the directory unless
--audit-signing-key names one, generated with <audit-dir>.pub at the first start;
'airlock audit verify <audit-dir>' checks it. Each replica needs a directory of its
own. Without --audit-dir none of these records is kept (sign-ins are only logged).

Pause on Kubernetes needs --snapshots: it commits the sandbox's container into an image
on its node and deletes the pod; resume makes the pod again from it under the same id
(processes restart over the files as they were); without --snapshots both answer 501.
The Credential Vault (--vault) lives in
each node's egressd (airlock egressd --vault-dir), reached at --egressd-port. Warm pools (--pool) are held by the leading replica: it creates, adopts
and claims their pods; creates served by another replica are created cold.

Secrets come from the environment: OPEN_SANDBOX_API_KEY (required unless --no-auth),
AIRLOCK_GATEWAY_KEY (what gateways send for sandbox port 18080),
AIRLOCK_EXECD_KEY (base64:… or hex:…: every sandbox's execd token derives from it; the
gateways need the same; default: derived from the API key) and
AIRLOCK_SIGNING_KEYS (comma-separated --signing-key values). In a pod, the Kubernetes
client is configured in-cluster; elsewhere from --kubeconfig or $KUBECONFIG.`,
		Example: `  OPEN_SANDBOX_API_KEY=... airlock lifecycle --namespace airlock-sandboxes \
      --system-namespace airlock-system --gateway sandboxes.example.com --dns 169.254.20.10 \
      --audit-dir /var/lib/airlock/audit`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := lf.config()
			if err != nil {
				return err
			}
			if c.APIKey == "" && !c.NoAuth {
				return errors.New("OPEN_SANDBOX_API_KEY is not set: every lifecycle replica needs the API key (--no-auth only for a test cluster)")
			}
			log := newLogger(lf.logLevel)
			if c.Kube, err = kubeConfig(lf.kubeconfig); err != nil {
				return err
			}
			c.Log = log
			c.Registry = prometheus.NewRegistry()
			c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			closeAudit, err := lf.openAudit(&c)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cp, err := cluster.Start(ctx, c)
			if err != nil {
				return errors.Join(err, closeAudit())
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "airlock lifecycle: serving on %s (sandboxes in %s, state in %s)\n", cp.Addr, c.Namespace, c.SystemNamespace)
			if lf.audit.Dir != "" {
				_, pub := lf.audit.KeyFiles()
				fmt.Fprintf(out, "airlock lifecycle: audit log %s, checkpoints signed (public key %s)\n", lf.audit.Dir, pub)
			}
			<-ctx.Done()
			log.Info("stopping: releasing the Lease; sandboxes keep running")
			return errors.Join(cp.Close(), closeAudit())
		},
	}
	lf.register(cmd.Flags())
	return cmd
}

// register adds the flags, each defaulting to cluster.DefaultConfig's value.
func (lf *lifecycleFlags) register(f *pflag.FlagSet) {
	lf.cfg = cluster.DefaultConfig()
	c := &lf.cfg
	for _, a := range c.DNS {
		lf.dns = append(lf.dns, a.String())
	}
	f.StringVar(&lf.runtimeKind, "runtime", "kubernetes", "the runtime; only kubernetes (one host with Docker: airlock up)")
	f.StringVar(&lf.kubeconfig, "kubeconfig", "", "kubeconfig file outside a pod (default $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&c.Listen, "listen", c.Listen, "address of the lifecycle API")
	f.StringVar(&c.Namespace, "namespace", c.Namespace, "namespace of the sandbox pods")
	f.StringVar(&c.SystemNamespace, "system-namespace", envOr("POD_NAMESPACE", c.SystemNamespace), "namespace of the state (Sandbox and Policy resources, token Secrets, the Lease); env POD_NAMESPACE")
	f.StringVar(&c.TokenNamespace, "token-namespace", c.TokenNamespace, "namespace of the access-token Secrets, one per sandbox (default the system namespace; a namespace of their own keeps lifecycle's Secret access away from the API key's)")
	f.StringVar(&c.Provider, "provider", c.Provider, "sandbox workload: pod, or agent-sandbox (the kubernetes-sigs/agent-sandbox Sandbox resource)")
	f.StringVar(&c.ExecdImage, "execd-image", c.ExecdImage, "image carrying the static execd for the init container (default airlock/execd:<version>)")
	f.StringVar(&c.ExecdClaim, "execd-claim", c.ExecdClaim, "PersistentVolumeClaim in --namespace holding the node's execd (installed by the egressd DaemonSet): sandbox pods start without the execd init container (empty: the init container)")
	f.StringVar(&c.RuntimeClassName, "runtime-class", c.RuntimeClassName, "runtimeClassName of sandbox pods (gvisor, kata); empty: the cluster's default")
	f.StringSliceVar(&lf.dns, "dns", lf.dns, "the sandboxes' resolver: egressd's node-local DNS address")
	f.Uint16Var(&lf.cfg.L7Port, "l7-port", lf.cfg.L7Port, "egressd's --l7-port (its transparent L7 proxy on the --dns address), which each sandbox's NetworkPolicy admits; 0: none")
	f.StringSliceVar(&lf.deny, "deny", nil, "a CIDR or address no sandbox's NetworkPolicy admits whatever its policy allows (repeatable): the cluster's pod, Service and node ranges, as egressd's --deny")
	f.StringSliceVar(&c.AllowedHostRoots, "allowed-host-root", c.AllowedHostRoots, "node directories under which host-path volumes may be mounted (none: host volumes refused)")
	f.IntVar(&c.MaxPTYSessions, "max-pty-sessions", c.MaxPTYSessions, "interactive terminals (execd PTY sessions) each sandbox may hold open at once; over it POST /pty answers 409 (0: execd's default, 16; negative: no limit)")
	f.StringVar(&c.Gateway, "gateway", c.Gateway, "the gateway's public host[:port] for endpoints (empty: this server's proxy)")
	f.StringVar(&c.BaseDomain, "base-domain", c.BaseDomain, "host-form endpoints <port>-<id>.<base domain> (a wildcard DNS name pointing at the gateway)")
	f.StringSliceVar(&lf.signingKeys, "signing-key", nil, "ID=base64:SECRET key to mint signed endpoints (also AIRLOCK_SIGNING_KEYS); the gateways verify with the same keys")
	f.StringVar((*string)(&c.DefaultAccess), "default-access", string(c.DefaultAccess), "admission of user ports: public or token (execd and the egress API always need the token)")
	f.StringVar(&c.PolicyDir, "policy-dir", c.PolicyDir, "the policy library directory (a mounted ConfigMap); empty: no named policies")
	f.StringVar(&c.DefaultPolicy, "default-policy", c.DefaultPolicy, "named policy of sandboxes created without one")
	f.IntVar(&c.EgressdPort, "egressd-port", c.EgressdPort, "port of every node's egressd status route (its --metrics-listen on the node address): entrypoints start and policy changes answer once it enforces them; 0: no gate (no egressd)")
	f.BoolVar(&c.Snapshots, "snapshots", c.Snapshots, "serve snapshots (POST /sandboxes/{id}/snapshots, restore by snapshotId): each node's egressd (--containerd-socket), reached at --egressd-port with the API key, commits a sandbox's container into an image kept on that node")
	f.BoolVar(&c.Vault, "vault", c.Vault, "serve the Credential Vault (credentialProxy sandboxes): each sandbox's vault lives in its node's egressd (--vault-dir), reached at --egressd-port with the API key")
	f.StringArrayVar(&lf.pools, "pool", nil, "a warm pool, name=NAME,image=IMAGE,size=N[,cpu=…][,memory=…] (repeatable; an empty value is none): held pods, enforced deny-all, that a create with the same image and limits claims")
	f.StringVar(&c.Identity, "identity", c.Identity, "this replica's name in the Lease (default $POD_NAME, then the host name)")
	f.DurationVar(&c.LeaseDuration, "lease-duration", c.LeaseDuration, "how long a stopped leader's Lease blocks a takeover")
	f.StringVar(&c.LeaderService, "leader-service", c.LeaderService, "a Service without selector in --system-namespace that the leading replica points at --advertise-address while it leads (its EndpointSlice): gateways and egressd follow the watch stream there (empty: none)")
	f.StringVar(&lf.advertise, "advertise-address", os.Getenv("POD_IP"), "this replica's address for --leader-service (env POD_IP)")
	f.DurationVar(&c.Limits.MaxTimeout, "max-timeout", c.Limits.MaxTimeout, "longest sandbox timeout a create may ask for (default lifecycle's, 24h)")
	f.DurationVar(&c.MaxSignedURLLifetime, "max-signed-url-lifetime", c.MaxSignedURLLifetime, "longest lifetime of a signed endpoint (?expires=) (default lifecycle's, 24h)")
	f.DurationVar(&c.ReadyTimeout, "ready-timeout", c.ReadyTimeout, "how long a pod may take to run and answer execd /ping (default lifecycle's, 120s)")
	f.BoolVar(&c.Console.Disabled, "no-console", c.Console.Disabled, "serve no operator console (/console/ on the API listener)")
	f.DurationVar(&c.Console.SessionTTL, "console-session-ttl", c.Console.SessionTTL, "how long a console sign-in lasts (default the console's, 12h)")
	f.StringSliceVar(&c.Console.TrustedOrigins, "console-trusted-origin", c.Console.TrustedOrigins, "an origin (https://airlock.example.com) whose console writes are accepted besides the request's own: a TLS-terminating Ingress in front of the replicas (repeatable)")
	lf.audit = stack.DefaultAuditConfig()
	registerAuditFlags(f, &lf.audit)
	registerAgentActionFlags(f, &lf.audit)
	f.StringVar(&lf.logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&c.NoAuth, "no-auth", c.NoAuth, "serve without an API key (a test cluster only)")
}

// config is the configuration the flags give, with the environment's secrets
// (OPEN_SANDBOX_API_KEY, AIRLOCK_GATEWAY_KEY, AIRLOCK_SIGNING_KEYS) and $POD_NAME; the
// Kubernetes client, logger and registry are the caller's.
func (lf *lifecycleFlags) config() (cluster.Config, error) {
	c := lf.cfg
	if lf.runtimeKind != "kubernetes" {
		return c, fmt.Errorf("--runtime %q: airlock lifecycle runs the Kubernetes runtime; on one host with Docker use 'airlock up'", lf.runtimeKind)
	}
	c.APIKey = os.Getenv("OPEN_SANDBOX_API_KEY")
	c.GatewayKey = os.Getenv("AIRLOCK_GATEWAY_KEY")
	// Every replica and gateway derives the same sandbox execd tokens: from
	// AIRLOCK_EXECD_KEY, else (cluster.Start) from the API key they all hold.
	if k := os.Getenv("AIRLOCK_EXECD_KEY"); k != "" {
		var err error
		if c.ExecdKey, err = execdtoken.ParseKey(k); err != nil {
			return c, fmt.Errorf("AIRLOCK_EXECD_KEY: %w", err)
		}
	}
	c.DNS = nil
	for _, s := range lf.dns {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("--dns %q: %w", s, err)
		}
		c.DNS = append(c.DNS, a)
	}
	for _, s := range lf.deny {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return c, fmt.Errorf("--deny %q: want a CIDR or an address: %w", s, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		c.Deny = append(c.Deny, p.Masked())
	}
	specs := lf.signingKeys
	if len(specs) == 0 {
		specs = envList("AIRLOCK_SIGNING_KEYS")
	}
	for _, spec := range specs {
		k, err := signedurl.ParseKey(spec)
		if err != nil {
			return c, fmt.Errorf("signing key: %w", err)
		}
		c.SigningKeys = append(c.SigningKeys, k)
	}
	for _, s := range lf.pools {
		if s == "" {
			continue // the manifests' empty AIRLOCK_POOL
		}
		p, err := cluster.ParsePool(s)
		if err != nil {
			return c, fmt.Errorf("--pool: %w", err)
		}
		c.Pools = append(c.Pools, p)
	}
	if c.Identity == "" {
		c.Identity = os.Getenv("POD_NAME")
	}
	if lf.advertise != "" {
		a, err := netip.ParseAddr(lf.advertise)
		if err != nil {
			return c, fmt.Errorf("--advertise-address %q: %w", lf.advertise, err)
		}
		c.AdvertiseAddress = a
	}
	return c, nil
}

// openAudit opens the audit log of --audit-dir (stack.OpenAudit, as airlock gateway and
// airlock up do: signing key made at the first start, OCSF export, anchors) into
// c.Audit, with c.Registry for its metrics and c.Log for its messages, and sets
// c.AgentActions. Without --audit-dir c.Audit stays nil (nothing is recorded). The
// returned function closes the log, flushing it; it is safe to call when none opened.
func (lf *lifecycleFlags) openAudit(c *cluster.Config) (closeFn func() error, err error) {
	c.AgentActions = lf.audit.AgentActions
	if lf.audit.Dir == "" {
		if c.Log != nil {
			c.Log.Info("no audit log (--audit-dir): control-plane records are not kept, console sign-ins only logged")
		}
		return func() error { return nil }, nil
	}
	var reg prometheus.Registerer
	if c.Registry != nil {
		reg = c.Registry
	}
	log := c.Log
	if log != nil {
		log = log.With("component", "audit")
	}
	w, err := stack.OpenAudit(lf.audit, reg, log)
	if err != nil {
		return nil, fmt.Errorf("--audit-dir %s: %w", lf.audit.Dir, err)
	}
	c.Audit = w
	return w.Close, nil
}

// Kubernetes client rate limits of lifecycle: client-go's defaults (5 requests/s, bursts
// of 10) are spent by the replicas' resyncs and pools, after which every request of a
// create, a pool claim or a policy change waits 200 ms (TestBenchNode measured a policy
// PUT at a flat 400 ms: a NetworkPolicy Get and Update).
const (
	kubeQPS   = 50
	kubeBurst = 100
)

// kubeConfig is the in-cluster configuration in a pod, else the kubeconfig file, with
// lifecycle's client rate limits (kubeQPS, kubeBurst).
func kubeConfig(path string) (*rest.Config, error) {
	c, err := loadKubeConfig(path)
	if err != nil {
		return nil, err
	}
	c.QPS, c.Burst = kubeQPS, kubeBurst
	return c, nil
}

// loadKubeConfig is the in-cluster configuration in a pod, else the kubeconfig file.
func loadKubeConfig(path string) (*rest.Config, error) {
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
