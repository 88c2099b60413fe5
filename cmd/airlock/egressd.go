package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/ebpf"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

func newEgressdCmd() *cobra.Command {
	var (
		watchURL, apiKey, dnsListen, resolver, mode, pinRoot, nftTable, node string
		auditDir, metricsListen, logLevel, dnsLocal, dnsIfname               string
		upstreams, denyAddrs                                                 []string
		l7Port, proxyPort                                                    uint16
	)
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
'airlock up' runs the same daemon inside the all-in-one process.

On Kubernetes it runs as a DaemonSet (hostNetwork, capabilities BPF, NET_ADMIN, PERFMON
and NET_BIND_SERVICE): --node (default $NODE_NAME, from the downward API's spec.nodeName) keeps it
to the pods of its node; each pod's host-side veth is found from the route to the pod
IP (a routed CNI such as Calico or ptp; bridged pods are refused and stay not
enforced); --dns-local-address puts the node-local DNS address that pods' dnsConfig
names on a dummy interface (--dns-interface) and serves DNS there; --audit-dir is a
hostPath directory of the node. See egressd/README.md, "On Kubernetes".

The API key may come from OPEN_SANDBOX_API_KEY.`,
		Example: `  airlock egressd --watch-url http://127.0.0.1:8080/internal/v1/watch \
      --dns-listen 172.30.0.1:53 --audit-dir /var/lib/airlock/audit --metrics-listen 127.0.0.1:9102

  # In a DaemonSet pod (NODE_NAME from the downward API):
  airlock egressd --watch-url http://airlock-lifecycle.airlock:8080/internal/v1/watch \
      --dns-local-address 169.254.20.10 --audit-dir /var/lib/airlock/audit --metrics-listen :9102`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(logLevel)}))
			if watchURL == "" || (dnsListen == "" && dnsLocal == "") {
				return fmt.Errorf("--watch-url and --dns-listen (or --dns-local-address) are required")
			}
			if node == "" {
				node = os.Getenv("NODE_NAME")
			}
			if apiKey == "" {
				apiKey = os.Getenv("OPEN_SANDBOX_API_KEY")
			}
			hdr := http.Header{}
			if apiKey != "" {
				hdr.Set("OPEN-SANDBOX-API-KEY", apiKey)
			}
			if len(upstreams) == 0 {
				var err error
				if upstreams, err = egressd.HostResolvers("/etc/resolv.conf"); err != nil {
					return err
				}
			}
			ov := policies.BaseOverlay()
			ov.DenyAddrs(egressd.HostAddrs()...)
			for _, s := range denyAddrs {
				if err := ov.Deny(s); err != nil {
					return fmt.Errorf("--deny %q: %w", s, err)
				}
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			cfg := egressd.Config{
				Watch:        watch.ClientConfig{URL: watchURL, Header: hdr, Log: log.With("component", "watch")},
				Enforcer:     enforcer.Config{Mode: enforcer.Mode(mode), EBPF: ebpf.Config{PinRoot: pinRoot}, NFT: nftfilter.Config{Table: nftTable}},
				DNSListen:    dnsListen,
				Upstreams:    upstreams,
				Overlay:      ov,
				Node:         node,
				DNSInterface: dnsIfname,
				L7Port:       l7Port,
				ProxyPort:    proxyPort,
				Registry:     reg,
				Logger:       log,
			}
			if dnsLocal != "" {
				a, err := netip.ParseAddr(dnsLocal)
				if err != nil {
					return fmt.Errorf("--dns-local-address: %w", err)
				}
				cfg.LocalDNS = a
			}
			if resolver != "" {
				a, err := netip.ParseAddr(resolver)
				if err != nil {
					return fmt.Errorf("--resolver: %w", err)
				}
				cfg.Resolver = a
			}
			if auditDir != "" {
				aw, err := audit.New(audit.Config{Dir: auditDir, Registry: reg, Logger: log})
				if err != nil {
					return err
				}
				defer aw.Close()
				cfg.Audit = aw
			}
			d, err := egressd.New(cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "==> egressd: %s datapath, DNS filter on %s, upstreams %v\n", d.Backend(), d.DNSAddr(), upstreams)
			if metricsListen != "" {
				mux := http.NewServeMux()
				mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
					if !d.Synced() {
						http.Error(w, "waiting for the first watch snapshot", http.StatusServiceUnavailable)
						return
					}
					fmt.Fprintln(w, "ok")
				})
				mux.Handle("GET "+watch.EnforcedPath+"{id}", d.StatusHandler())
				defer serveHTTP(metricsListen, mux, log).Close()
				fmt.Fprintf(cmd.OutOrStdout(), "==> metrics on http://%s/metrics, health on /healthz, enforcement status on %s<id>\n", metricsListen, watch.EnforcedPath)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = d.Run(ctx)
			fmt.Fprintln(cmd.OutOrStdout(), "==> egressd stopped; sandboxes stay enforced until it runs again")
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&watchURL, "watch-url", "", "lifecycle watch stream URL, e.g. http://127.0.0.1:8080/internal/v1/watch (required)")
	f.StringVar(&apiKey, "api-key", "", "lifecycle API key for the watch (default $OPEN_SANDBOX_API_KEY)")
	f.StringVar(&dnsListen, "dns-listen", "", "DNS filter address, the Airlock bridge's gateway:53 (required unless --dns-local-address)")
	f.StringVar(&dnsLocal, "dns-local-address", "", "node-local DNS address to create and serve on, e.g. 169.254.20.10 on Kubernetes (the pods' dnsConfig nameserver); --dns-listen defaults to it, port 53")
	f.StringVar(&dnsIfname, "dns-interface", egressd.DefaultDNSInterface, "dummy interface that carries --dns-local-address (created if missing, never removed)")
	f.StringVar(&resolver, "resolver", "", "address sandboxes send DNS to (default the --dns-listen host)")
	f.StringSliceVar(&upstreams, "upstream", nil, "upstream resolver host:port (repeatable; default the host's /etc/resolv.conf)")
	f.StringVar(&mode, "mode", string(enforcer.ModeAuto), "datapath: auto (eBPF, else nftables), ebpf or nftables")
	f.StringVar(&pinRoot, "pin-root", ebpf.DefaultPinRoot, "bpffs directory of the pinned eBPF state")
	f.StringVar(&nftTable, "nft-table", nftfilter.TableName, "name of the nftables tables (inet and netdev) of the nftables datapath; another egressd in this network namespace needs another name (and --pin-root)")
	f.Uint16Var(&l7Port, "l7-port", 15001, "port of the L7 (TLS SNI / HTTP Host) proxy on the resolver address, for `l7: sni` policies (0: off)")
	f.Uint16Var(&proxyPort, "proxy-port", 0, "port of the explicit HTTP proxy on the resolver address, for sandboxes given HTTP_PROXY/HTTPS_PROXY (0: off)")
	f.StringVar(&node, "node", "", "this node's name; sandboxes of other nodes are ignored (default $NODE_NAME; empty: one host)")
	f.StringSliceVar(&denyAddrs, "deny", nil, "extra operator always-deny target (address, CIDR or name; repeatable), e.g. the control plane")
	f.StringVar(&auditDir, "audit-dir", "", "hash-chained audit log directory (empty: no audit)")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve /metrics, /healthz and "+watch.EnforcedPath+"<id> (which lifecycle replicas on Kubernetes ask before releasing a sandbox) on this address (empty: off)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
