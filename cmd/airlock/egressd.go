package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/stack"
)

// egressdFlags are the flags of `airlock egressd`: they fill a stack.EgressdConfig, the
// configuration airlock up builds its egressd from, and show its defaults.
type egressdFlags struct {
	cfg      stack.EgressdConfig
	logLevel string
}

func newEgressdCmd() *cobra.Command { return egressdCommand(&egressdFlags{}) }

func egressdCommand(ef *egressdFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egressd",
		Short: "Run the egress daemon alone: DNS filter and eBPF/nftables datapath for this node's sandboxes",
		Long: `Runs Airlock's egress daemon for the sandboxes of this node. It follows lifecycle's
watch stream; for each sandbox it finds the host side of its veth, attaches the egress
datapath (a TC/TCX eBPF program, or nftables where eBPF cannot attach; --mode) and
programs its policy. Its DNS filter (--dns-listen, normally the Airlock bridge's gateway
address, port 53, which is every sandbox's only resolver) forwards allowed names to the
upstreams and writes the answers' addresses into the datapath before the answer leaves.
Policy changes apply to running sandboxes at once; deleted sandboxes are detached and
every map entry, rule and set of theirs removed.

Enforcement outlives the process: stopping or killing egressd leaves every sandbox
enforced with its last policy (fail closed); the next start adopts the pinned state.
'airlock up' runs the same daemon, built by the same code with the same defaults, inside
the all-in-one process: each flag here is a key of airlock.yaml's egress section
(--mode is egress.mode, --l7-port egress.l7Port, ...).

DNS and connection decisions go to the hash-chained audit log in --audit-dir, as in
'airlock up': every checkpoint is signed with an Ed25519 key, <audit-dir>.key beside the
directory unless --audit-signing-key names one, generated with its public key
<audit-dir>.pub at the first start. 'airlock audit verify <audit-dir>' checks the chain
and the signatures.

On Kubernetes it runs as a DaemonSet (hostNetwork, capabilities BPF, NET_ADMIN, PERFMON
and NET_BIND_SERVICE): --node (default $NODE_NAME, from the downward API's spec.nodeName) keeps it
to the pods of its node; each pod's host-side veth is found from the route to the pod
IP (a routed CNI such as Calico or ptp; bridged pods are refused and stay not
enforced); --dns-local-address puts the node-local DNS address that pods' dnsConfig
names on a dummy interface (--dns-interface) and serves DNS there; --audit-dir and its
key are in a hostPath directory of the node. See egressd/README.md, "On Kubernetes".

The API key may come from OPEN_SANDBOX_API_KEY.`,
		Example: `  airlock egressd --watch-url http://127.0.0.1:8080/internal/v1/watch \
      --dns-listen 172.30.0.1:53 --audit-dir /var/lib/airlock/audit --metrics-listen 127.0.0.1:9102

  # In a DaemonSet pod (NODE_NAME from the downward API):
  airlock egressd --watch-url http://airlock-lifecycle.airlock:8080/internal/v1/watch \
      --dns-local-address 169.254.20.10 --l7-port 15001 --audit-dir /var/lib/airlock/audit --metrics-listen :9102`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := ef.config()
			if err != nil {
				return err
			}
			if cfg.WatchURL == "" || (cfg.DNSListen == "" && !cfg.DNSLocalAddress.IsValid()) {
				return errors.New("--watch-url and --dns-listen (or --dns-local-address) are required")
			}
			cfg.Log = newLogger(ef.logLevel)
			d, err := stack.NewEgressd(cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "==> egressd: %s datapath, DNS filter on %s, upstreams %v\n", d.Backend(), d.DNSAddr(), d.Upstreams)
			if cfg.Audit.Dir != "" {
				_, pub := cfg.Audit.KeyFiles()
				fmt.Fprintf(out, "==> audit log %s, checkpoints signed (public key %s)\n", cfg.Audit.Dir, pub)
			}
			if cfg.MetricsListen != "" {
				fmt.Fprintf(out, "==> metrics on http://%s/metrics, health on /healthz, enforcement status on %s<id>\n", cfg.MetricsListen, watch.EnforcedPath)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = d.Run(ctx)
			fmt.Fprintln(out, "==> egressd stopped; sandboxes stay enforced until it runs again")
			return err
		},
	}
	ef.register(cmd.Flags())
	return cmd
}

// register adds the flags, each defaulting to stack.DefaultEgressdConfig's value.
func (ef *egressdFlags) register(f *pflag.FlagSet) {
	ef.cfg = stack.DefaultEgressdConfig()
	c := &ef.cfg
	f.StringVar(&c.WatchURL, "watch-url", c.WatchURL, "lifecycle watch stream URL, e.g. http://127.0.0.1:8080/internal/v1/watch (required)")
	f.StringVar(&c.WatchFallbackURL, "watch-fallback-url", c.WatchFallbackURL, "watch stream followed while --watch-url cannot be reached, 30 s at a time (Kubernetes: --watch-url is the leading lifecycle replica's Service, this every replica's)")
	f.StringVar(&c.APIKey, "api-key", c.APIKey, "lifecycle API key for the watch (default $OPEN_SANDBOX_API_KEY)")
	f.StringVar(&c.DNSListen, "dns-listen", c.DNSListen, "DNS filter address, the Airlock bridge's gateway:53 (required unless --dns-local-address)")
	f.Var(addrValue{&c.DNSLocalAddress}, "dns-local-address", "node-local DNS address to create and serve on, e.g. 169.254.20.10 on Kubernetes (the pods' dnsConfig nameserver); --dns-listen defaults to it, port 53")
	f.StringVar(&c.DNSInterface, "dns-interface", c.DNSInterface, "dummy interface that carries --dns-local-address (created if missing, never removed)")
	f.Var(addrValue{&c.Resolver}, "resolver", "address sandboxes send DNS to (default --dns-local-address, else the --dns-listen host)")
	f.StringSliceVar(&c.Upstreams, "upstream", c.Upstreams, "upstream resolver host:port, or host for port 53 (repeatable; default the host's /etc/resolv.conf); airlock.yaml egress.upstreams")
	f.StringVar(&c.Mode, "mode", c.Mode, "datapath: auto (eBPF, else nftables), ebpf or nftables; airlock.yaml egress.mode")
	f.StringVar(&c.PinRoot, "pin-root", c.PinRoot, "bpffs directory of the pinned eBPF state; airlock.yaml egress.pinRoot")
	f.BoolVar(&c.AttributionDisabled, "no-attribution", c.AttributionDisabled, "do not record which process opened each flow (eBPF process attribution off); airlock.yaml egress.attributionDisabled")
	f.StringVar(&c.NFTTable, "nft-table", c.NFTTable, "name of the nftables tables (inet and netdev) of the nftables datapath; another egressd in this network namespace needs another name (and --pin-root); airlock.yaml egress.nftTable")
	f.IntVar(&c.L7Port, "l7-port", c.L7Port, "port of the L7 (TLS SNI / HTTP Host) proxy on the resolver address, for l7: sni policies (0: off); airlock.yaml egress.l7Port")
	f.IntVar(&c.ProxyPort, "proxy-port", c.ProxyPort, "port of the explicit HTTP proxy on the resolver address, for sandboxes given HTTP_PROXY/HTTPS_PROXY (0: off); airlock.yaml egress.proxyPort")
	f.StringVar(&c.VaultPlainHTTP, "vault-plain-http", c.VaultPlainHTTP, "to which addresses a plain-HTTP request for a Credential Vault binding may carry its credential: learned (only one learned from DNS for the name; default) or policy (any the policy accepts, also one the sandbox chose); airlock.yaml vault.plainHTTP")
	f.StringVar(&c.VaultDir, "vault-dir", c.VaultDir, "run a Credential Vault in this directory (the node key and each sandbox's sealed vault), served to lifecycle replicas on --metrics-listen behind the API key (Kubernetes; empty: none)")
	f.StringVar(&c.ContainerdSocket, "containerd-socket", c.ContainerdSocket, "the node's containerd socket: serve the snapshot node API (commit a sandbox pod's container into a node-local image) to lifecycle replicas on --metrics-listen behind the API key (Kubernetes; empty: none)")
	f.StringVar(&c.ContainerdNamespace, "containerd-namespace", c.ContainerdNamespace, "containerd namespace of the kubelet's images and containers, with --containerd-socket (empty: k8s.io)")
	f.StringVar(&c.UpstreamCAFile, "upstream-ca-file", c.UpstreamCAFile, "PEM file of extra CA certificates trusted for the upstreams of Credential Vault (intercepted) connections, beside the system roots; airlock.yaml egress.upstreamCAFile")
	f.StringVar(&c.Node, "node", c.Node, "this node's name; sandboxes of other nodes are ignored (default $NODE_NAME; empty: one host)")
	f.StringVar(&c.CgroupRoot, "cgroup-root", c.CgroupRoot, "the node's cgroup hierarchy (a cgroup v2 directory, or one with it at unified/), where a pod's cgroup is found by its UID for the socket layer (EPERM on a denied connect); on Kubernetes a hostPath mount of the node's /sys/fs/cgroup (default: egressd's own cgroup2 mount)")
	f.StringSliceVar(&c.Deny, "deny", c.Deny, "extra operator always-deny target (address, CIDR or name; repeatable), e.g. the control plane; airlock.yaml egress.deny")
	f.IntVar(&c.DNSGuard.NamesPerSandbox, "dns-names-per-sandbox", c.DNSGuard.NamesPerSandbox, "DNS tunnelling guard: distinct names a sandbox may resolve per minute (negative: off); airlock.yaml egress.dnsGuard.namesPerSandbox")
	f.IntVar(&c.DNSGuard.NamesPerDomain, "dns-names-per-domain", c.DNSGuard.NamesPerDomain, "DNS tunnelling guard: distinct names per registrable domain (eTLD+1), sandbox and minute (negative: off); airlock.yaml egress.dnsGuard.namesPerDomain")
	f.IntVar(&c.DNSGuard.NamesPerRule, "dns-names-per-rule", c.DNSGuard.NamesPerRule, "DNS tunnelling guard: distinct names one rule lets through per sandbox and minute (negative: off); airlock.yaml egress.dnsGuard.namesPerRule")
	f.Float64Var(&c.DNSGuard.MaxLabelBits, "dns-max-label-bits", c.DNSGuard.MaxLabelBits, "DNS tunnelling guard: highest score (bits of random-looking data) a query name's label may have (negative: off); airlock.yaml egress.dnsGuard.maxLabelBits")
	registerAuditFlags(f, &c.Audit)
	f.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "serve /metrics, /healthz and "+watch.EnforcedPath+"<id> (which lifecycle replicas on Kubernetes ask before releasing a sandbox) on this address (empty: off)")
	f.StringVar(&ef.logLevel, "log-level", "info", "debug, info, warn or error")
}

// config is the configuration the flags give, with the environment's fallbacks
// ($NODE_NAME, $OPEN_SANDBOX_API_KEY), resolved and checked.
func (ef *egressdFlags) config() (stack.EgressdConfig, error) {
	c := ef.cfg
	if c.Node == "" {
		c.Node = os.Getenv("NODE_NAME")
	}
	if c.APIKey == "" {
		c.APIKey = os.Getenv("OPEN_SANDBOX_API_KEY")
	}
	return c.Resolved()
}
