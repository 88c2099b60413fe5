package main

import (
	"fmt"

	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/stack/purge"
)

func newDownCmd() *cobra.Command {
	var (
		sf                   stackFlags
		nftNetNS             string
		purgeAll, purgeAudit bool
	)
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop airlock up on this host; --purge also removes what it made",
		Long: `Stops a running 'airlock up' (airlock.service through systemctl when systemd runs it,
else the process in <state dir>/` + purge.PIDFile + `: SIGTERM, then SIGKILL after 25 s).
Sandboxes keep running: a later 'airlock up' adopts them.

--purge also removes everything this installation made on the host: its sandbox
containers (those carrying its instance id), the Docker network, the pinned eBPF state,
the nftables tables inet and netdev airlock and the state directory (store, API key, signing key).
The audit log is kept, as the compliance record, unless --purge-audit is given.
Running it again finds nothing to remove. Reads the same configuration as 'airlock up'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := sf.load(cmd)
			if err != nil {
				return err
			}
			if cfg, err = cfg.Resolved(); err != nil {
				return err
			}
			pc := purge.Config{
				StateDir:   cfg.StateDir,
				AuditDir:   cfg.Audit.Dir,
				Network:    cfg.Docker.Network,
				PinRoot:    cfg.Egress.PinRoot,
				NFTTable:   cfg.Egress.NFTTable,
				NFTNetNS:   nftNetNS,
				PurgeAudit: purgeAudit,
				Out:        cmd.OutOrStdout(),
			}
			running, err := purge.Stop(cmd.Context(), pc)
			if err != nil {
				return err
			}
			if !running {
				fmt.Fprintf(cmd.OutOrStdout(), "no airlock up running (no live process in %s)\n", cfg.StateDir)
			}
			if !purgeAll && !purgeAudit {
				return nil
			}
			docker, err := client.New(client.FromEnv)
			if err != nil {
				return err
			}
			defer docker.Close()
			return purge.Purge(cmd.Context(), pc, docker)
		},
	}
	f := cmd.Flags()
	sf.register(cmd, false)
	f.BoolVar(&purgeAll, "purge", false, "also remove containers, network, pinned eBPF state, nftables table and state")
	f.BoolVar(&purgeAudit, "purge-audit", false, "with --purge, remove the audit log too (implies --purge)")
	f.StringVar(&nftNetNS, "nft-netns", "", "network namespace whose nftables table is removed (tests)")
	_ = f.MarkHidden("nft-netns")
	return cmd
}
