package main

import (
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/stack"
)

// stackFlags are the flags that say which stack a command is about, shared by up,
// doctor and down: the configuration file and the overrides of where it lives.
type stackFlags struct {
	config, stateDir, listen, gwListen string
	noGateway, noEgress                bool
}

// register adds --config and --state-dir, and with addrs the listen addresses and the
// component switches.
func (s *stackFlags) register(cmd *cobra.Command, addrs bool) {
	f := cmd.Flags()
	f.StringVar(&s.config, "config", "", "configuration file (default "+stack.DefaultConfigPath+" when present)")
	f.StringVar(&s.stateDir, "state-dir", stack.DefaultStateDir, "directory of the store, the keys and the audit log")
	if addrs {
		f.StringVar(&s.listen, "listen", stack.DefaultListen, "lifecycle API address")
		f.StringVar(&s.gwListen, "gateway-listen", stack.DefaultGatewayConfig().Listen, "gateway address (sandbox endpoints point here)")
		f.BoolVar(&s.noGateway, "no-gateway", false, "run without the gateway: endpoints use lifecycle's server proxy")
		f.BoolVar(&s.noEgress, "no-egress", false, "run without egress enforcement: sandboxes reach whatever the host reaches")
	}
}

// load reads the configuration file (the default one only when present) and applies
// the flags the user set.
func (s *stackFlags) load(cmd *cobra.Command) (stack.Config, error) {
	path, optional := s.config, false
	if path == "" {
		path, optional = stack.DefaultConfigPath, true
	}
	cfg, err := stack.LoadConfig(path, optional)
	if err != nil {
		return cfg, err
	}
	f := cmd.Flags()
	if f.Changed("state-dir") {
		cfg.StateDir = s.stateDir
	}
	if f.Changed("listen") {
		cfg.Listen = s.listen
	}
	if f.Changed("gateway-listen") {
		cfg.Gateway.Listen = s.gwListen
	}
	if f.Changed("no-gateway") {
		cfg.Gateway.Disabled = s.noGateway
	}
	if f.Changed("no-egress") {
		cfg.Egress.Disabled = s.noEgress
	}
	return cfg, nil
}
