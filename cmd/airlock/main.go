// Command airlock is Airlock's CLI and servers: `airlock up` runs the whole stack on one
// host; the other subcommands build images, manage sandboxes, check policies and audit
// logs, or run one server alone.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/internal/buildinfo"
)

func main() {
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Airlock: sandboxes for AI agents with their own URL and egress firewall",
		Long:          "Airlock runs sandboxes (containers) for AI agents. Each gets its own URL through the gateway and an egress firewall that lets it reach only what its policy allows, with every decision in a tamper-evident audit log. It speaks the OpenSandbox lifecycle and execd protocols.",
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newImageCmd(),
		newGatewayCmd(),
		newUpCmd(), newSandboxCmd(),
		newPolicyCmd(),
		newAuditCmd(),
	)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}
