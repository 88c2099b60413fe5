package stack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// startEgress runs egressd in this process: its DNS filter on the Airlock bridge's
// gateway address (the sandboxes' only resolver, docker.Config.DNSOnGateway), its
// datapath on every sandbox's veth, following lifecycle's watch over loopback. It
// waits for the first snapshot so that sandboxes adopted at start are enforced when
// `airlock up` reports ready.
func (s *Stack) startEgress(ctx context.Context) error {
	_, _, gw := s.Docker.Network()
	if !gw.IsValid() {
		return fmt.Errorf("the Docker network has no gateway address for the DNS filter")
	}
	e := s.egressConfig()
	e.WatchURL = "http://" + loopbackAddr(s.Addr) + "/internal/v1/watch"
	e.APIKey = s.APIKey
	e.DNSListen = netip.AddrPortFrom(gw, 53).String()
	if s.Vault != nil {
		e.Vault = s.Vault
	}
	e.AuditWriter, e.Registry, e.Log = s.Audit, s.registry, s.log.With("component", "egressd")
	d, err := NewEgressd(e)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(runCtx); err != nil {
			s.log.Error("egressd stopped", "err", err)
		}
	}()
	s.Egress = d
	s.egress.Store(d.Daemon)
	s.stopEgressFn = func() { cancel(); <-done }
	deadline := time.Now().Add(10 * time.Second)
	for !d.Synced() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !d.Synced() {
		s.log.Warn("egressd has not received the sandbox list yet; it keeps trying")
	}
	return nil
}

// egressConfig is the egress configuration with the Airlock network's subnets (IPv4
// and IPv6) added to the operator overlay's denies: sandboxes never reach each other,
// whatever a policy allows (Docker's inter-container block does not cover what
// egressd's explicit proxy dials from the host).
func (s *Stack) egressConfig() EgressdConfig {
	e := s.cfg.Egress
	e.Deny = slices.Clone(e.Deny)
	_, subnet, _ := s.Docker.Network()
	subnet6, _ := s.Docker.Network6()
	for _, p := range []netip.Prefix{subnet, subnet6} {
		if p.IsValid() {
			e.Deny = append(e.Deny, p.Masked().String())
		}
	}
	return e
}

// proxyEnv is the environment that points a sandbox's HTTP clients at egressd's
// explicit proxy (EgressConfig.ProxyPort); nil when it is off.
func (s *Stack) proxyEnv() map[string]string {
	if s.cfg.Egress.Disabled || s.cfg.Egress.ProxyPort == 0 {
		return nil
	}
	_, _, gw := s.Docker.Network()
	u := "http://" + netip.AddrPortFrom(gw, uint16(s.cfg.Egress.ProxyPort)).String()
	const noProxy = "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
	}
}

// readyGate is lifecycle's ready gate: with egress on, a sandbox is Running only once
// egressd enforces its policy (egressd starts after lifecycle, so creates in between
// wait for it).
func (s *Stack) readyGate() func(string) bool {
	if s.cfg.Egress.Disabled {
		return nil
	}
	return func(id string) bool {
		d := s.egress.Load()
		return d != nil && d.Enforced(id)
	}
}

// policyGate is lifecycle's policy gate: a policy change answers once egressd
// enforces it.
func (s *Stack) policyGate() func(string, uint64) bool {
	if s.cfg.Egress.Disabled {
		return nil
	}
	return func(id string, version uint64) bool {
		d := s.egress.Load()
		if d == nil {
			return false
		}
		v, ok := d.EnforcedVersion(id)
		return ok && v >= version
	}
}

func (s *Stack) stopEgress(context.Context) error {
	if s.stopEgressFn != nil {
		s.stopEgressFn()
	}
	return nil
}
