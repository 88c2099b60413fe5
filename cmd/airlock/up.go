package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlockdev/airlock/deploy/systemd"
	"github.com/airlockdev/airlock/stack"
	"github.com/airlockdev/airlock/stack/purge"
)

func newUpCmd() *cobra.Command {
	var (
		sf         stackFlags
		noAuth     bool
		logLevel   string
		egressMode string
		proxyPort  int
		install    bool
		skipChecks bool
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run Airlock on this host: lifecycle API, gateway, egress firewall, Docker runtime, store, audit",
		Long: `Runs the whole Airlock stack in one process on this host: the OpenSandbox lifecycle
API (default 127.0.0.1:8080, also under /v1) with the Docker runtime and the embedded
store in the state directory, and the ingress gateway (embedded Caddy, default
127.0.0.1:8081) that every sandbox endpoint points at, and the egress daemon: the DNS
filter on the Airlock bridge (the sandboxes' only resolver) and the eBPF datapath
(nftables where eBPF cannot attach) on every sandbox's veth, enforcing the
networkPolicy given at creation (none: everything but the host, the control plane,
cloud metadata and private addresses). Gateway, DNS and connection decisions
go to the hash-chained audit log in <state dir>/audit, whose checkpoints are signed
with the Ed25519 key <state dir>/audit.key ('airlock audit verify' checks the chain and,
with audit.pub beside it, the signatures). On first start it generates an API key and
the audit signing key, stores them in the state directory and prints the API key; later
starts reuse them (--no-auth: no API key at all).

Configuration comes from ` + stack.DefaultConfigPath + ` (or --config); unknown keys are errors.
Flags override the file. The gateway and egressd are built by the same code, with the
same settings and defaults, as 'airlock gateway' and 'airlock egressd' (stack/README.md).

Before starting it checks the host like 'airlock doctor' and refuses to start when a
hard prerequisite fails (root, bpffs, the Docker engine, free ports, ...), printing the
table with the fixes; --skip-checks starts anyway.

--install-service installs this binary and execd under /usr/local, writes the systemd
unit ` + systemd.UnitPath + ` (restart on failure, state in /var/lib/airlock, log in
the journal) running 'airlock up' with the other flags given here, and enables and
starts it when systemd runs the host; then it exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if install {
				return installService(cmd)
			}
			cfg, err := sf.load(cmd)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("no-auth") {
				cfg.NoAuth = noAuth
			}
			if f.Changed("egress-mode") {
				cfg.Egress.Mode = egressMode
			}
			if f.Changed("egress-proxy-port") {
				cfg.Egress.ProxyPort = proxyPort
			}
			if f.Changed("log-level") {
				cfg.LogLevel = logLevel
			}
			if !skipChecks {
				if err := checkHost(cmd, cfg); err != nil {
					return err
				}
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(cfg.LogLevel)}))
			st, err := stack.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := st.Start(ctx); err != nil {
				return err
			}
			pidFile := filepath.Join(st.StateDir(), purge.PIDFile)
			if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
				log.Warn("writing the pid file failed: airlock down will not find this process", "path", pidFile, "err", err)
			}
			defer os.Remove(pidFile)
			printBanner(os.Stdout, st)
			<-ctx.Done()
			log.Info("shutting down")
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return st.Stop(sctx)
		},
	}
	f := cmd.Flags()
	sf.register(cmd, true)
	def := stack.DefaultEgressdConfig()
	f.StringVar(&egressMode, "egress-mode", def.Mode, "egress datapath: auto (eBPF, else nftables), ebpf or nftables (egress.mode)")
	f.IntVar(&proxyPort, "egress-proxy-port", def.ProxyPort, "run the explicit egress proxy on the bridge gateway at this port and give sandboxes HTTP_PROXY/HTTPS_PROXY (0: off; egress.proxyPort)")
	f.BoolVar(&noAuth, "no-auth", false, "serve the API without an API key (local use only)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&skipChecks, "skip-checks", false, "start without the host check (airlock doctor) that refuses a host which cannot run the stack")
	f.BoolVar(&install, "install-service", false, "install airlock as the systemd service airlock.service (with the other flags given) and exit")
	return cmd
}

// installService installs the running binary as airlock.service, passing on every flag
// the user set except --install-service.
func installService(cmd *cobra.Command) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var args []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name != "install-service" {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	return systemd.Installer{
		Binary: exe,
		Execd:  stack.DefaultExecdPath(),
		Args:   args,
		Out:    cmd.OutOrStdout(),
	}.Install()
}

// printBanner prints the API address, the key and a three-line SDK example.
func printBanner(w io.Writer, s *stack.Stack) {
	addr := s.Addr.String()
	fmt.Fprintf(w, "Airlock is up.\n\n  Lifecycle API: http://%s (also under /v1)\n", addr)
	if s.Gateway != nil {
		gw := s.Gateway.Addr()
		_, port, _ := net.SplitHostPort(gw)
		fmt.Fprintf(w, "  Gateway:       http://%s  (a sandbox port in a browser: http://<port>-<id>.airlock.localhost:%s/,\n", gw, port)
		fmt.Fprintf(w, "                 one origin per sandbox port; execd, the egress API and SDK clients: http://%s/sandboxes/<id>/proxy/<port>/)\n", gw)
	}
	if s.Egress != nil {
		fmt.Fprintf(w, "  Egress:        %s datapath, DNS filter on %s (policy: networkPolicy at create)\n", s.Egress.Backend(), s.Egress.DNSAddr())
		if p := s.Egress.ProxyAddr(); p.IsValid() {
			fmt.Fprintf(w, "                 explicit proxy on %s (HTTP_PROXY/HTTPS_PROXY in every new sandbox)\n", p)
		}
	} else {
		fmt.Fprintf(w, "  Egress:        NOT ENFORCED (--no-egress): sandboxes reach whatever this host reaches\n")
	}
	if s.Audit != nil {
		fmt.Fprintf(w, "  Audit log:     %s (airlock audit verify %s)\n", s.AuditDir(), s.AuditDir())
	}
	keyArg := ""
	if s.APIKey != "" {
		fmt.Fprintf(w, "  OPEN-SANDBOX-API-KEY: %s\n", s.APIKey)
		keyArg = fmt.Sprintf(", apiKey: %q", s.APIKey)
	} else {
		fmt.Fprintf(w, "  Authentication: OFF (--no-auth)\n")
	}
	fmt.Fprintf(w, "\nOpenSandbox SDK (npm install @alibaba-group/opensandbox):\n\n")
	fmt.Fprintf(w, "  import { Sandbox } from \"@alibaba-group/opensandbox\";\n")
	fmt.Fprintf(w, "  const sbx = await Sandbox.create({ connectionConfig: { domain: %q%s }, image: \"airlock/sandbox:latest\" });\n", addr, keyArg)
	fmt.Fprintf(w, "  console.log((await sbx.commands.run(\"echo hello from $(hostname)\")).logs.stdout[0].text);\n\n")
}
