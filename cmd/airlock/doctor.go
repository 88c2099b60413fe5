package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/internal/doctor"
	"github.com/airlockdev/airlock/internal/up"
)

func newDoctorCmd() *cobra.Command {
	var (
		configPath, stateDir, listen, gwListen string
		noGateway, noEgress, asJSON            bool
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for Airlock: one row per prerequisite, with the fix",
		Long: `Checks what 'airlock up' needs on this host, with the same configuration file and
flags: root, kernel and BTF, bpffs, TCX or clsact, cgroup v2, nftables over netlink,
the Docker engine and its version, the Airlock network and its subnet against the host's
routes, free ports (lifecycle API, gateway, DNS on the bridge), the sandbox image, the
state directory, and Node (SDK tests only). Each row is ok, missing or degraded, with the
fix; "(hard)" marks what keeps the stack from running.

Exit status 0 only when the stack can run. --json prints {"rows": [...], "ok": bool}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, optional := configPath, false
			if path == "" {
				path, optional = up.DefaultConfigPath, true
			}
			cfg, err := up.LoadConfig(path, optional)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("state-dir") {
				cfg.StateDir = stateDir
			}
			if f.Changed("listen") {
				cfg.Listen = listen
			}
			if f.Changed("gateway-listen") {
				cfg.Gateway.Listen = gwListen
			}
			if f.Changed("no-gateway") {
				cfg.Gateway.Disabled = noGateway
			}
			if f.Changed("no-egress") {
				cfg.Egress.Disabled = noEgress
			}
			dc, err := cfg.Doctor()
			if err != nil {
				return err
			}
			rep := doctor.Run(cmd.Context(), dc)
			if asJSON {
				err = rep.WriteJSON(cmd.OutOrStdout())
			} else {
				err = rep.WriteTable(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if !rep.OK {
				os.Exit(1) // the table said why; no second message
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "configuration file (default "+up.DefaultConfigPath+" when present)")
	f.StringVar(&stateDir, "state-dir", "/var/lib/airlock", "state directory airlock up would use")
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "lifecycle API address airlock up would use")
	f.StringVar(&gwListen, "gateway-listen", "127.0.0.1:8081", "gateway address airlock up would use")
	f.BoolVar(&noGateway, "no-gateway", false, "check for airlock up --no-gateway")
	f.BoolVar(&noEgress, "no-egress", false, "check for airlock up --no-egress")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// checkHost runs the doctor for cfg and returns an error naming the failing hard rows
// (with the table on stderr), so airlock up refuses to start on a host that cannot run it.
func checkHost(cmd *cobra.Command, cfg up.Config) error {
	dc, err := cfg.Doctor()
	if err != nil {
		return err
	}
	rep := doctor.Run(cmd.Context(), dc)
	if rep.OK {
		return nil
	}
	_ = rep.WriteTable(cmd.ErrOrStderr())
	fmt.Fprintln(cmd.ErrOrStderr())
	return rep.Err()
}
