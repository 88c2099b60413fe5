// Command airlock is Airlock's CLI and servers: `airlock up` runs the whole stack on one
// host; the other subcommands build images, manage sandboxes, check policies and audit
// logs, or run one server alone.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/internal/buildinfo"
)

func main() {
	reexecForExtendedConnect()
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
		newGatewayCmd(), newEgressdCmd(), newLifecycleCmd(),
		newUpCmd(), newSandboxCmd(), newKeyCmd(),
		newPolicyCmd(),
		newAuditCmd(),
		newDoctorCmd(), newDownCmd(),
	)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}

// reexecForExtendedConnect re-executes the servers that embed the gateway (up, gateway)
// with GODEBUG=http2xconnect=1: Go's HTTP/2 server accepts WebSockets over HTTP/2 (RFC
// 8441 extended CONNECT) only when that setting is in the environment at process start.
// Any failure leaves the process running as it is (h2 WebSockets then get 405; HTTP/1.1
// upgrades are unaffected).
func reexecForExtendedConnect() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "gateway") {
		return
	}
	godebug := os.Getenv("GODEBUG")
	if strings.Contains(godebug, "http2xconnect=") {
		return
	}
	if godebug != "" {
		godebug += ","
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	env := append(os.Environ(), "GODEBUG="+godebug+"http2xconnect=1")
	_ = syscall.Exec(exe, os.Args, env)
}
