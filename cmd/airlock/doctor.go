package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/stack"
	"github.com/airlockdev/airlock/stack/doctor"
)

func newDoctorCmd() *cobra.Command {
	var (
		sf     stackFlags
		asJSON bool
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
			cfg, err := sf.load(cmd)
			if err != nil {
				return err
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
	sf.register(cmd, true)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// checkHost runs the doctor for cfg and returns an error naming the failing hard rows
// (with the table on stderr), so airlock up refuses to start on a host that cannot run it.
func checkHost(cmd *cobra.Command, cfg stack.Config) error {
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
