package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	egressbpf "github.com/airlockdev/airlock/ebpf"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

// EgressConfig configures the embedded egress daemon (package egressd).
type EgressConfig struct {
	// Disabled turns egress enforcement off: sandboxes then use Docker's resolvers and
	// reach whatever the host reaches. Say so loudly to whoever runs agents.
	Disabled bool `yaml:"disabled"`
	// Mode picks the datapath: auto (default: eBPF, nftables when eBPF cannot attach),
	// ebpf or nftables.
	Mode string `yaml:"mode"`
	// Upstreams are the resolvers allowed names are forwarded to ("host:port" or
	// "host"); default the nameservers of the host's /etc/resolv.conf.
	Upstreams []string `yaml:"upstreams"`
	// L7Port is the port of the transparent L7 proxy on the bridge gateway address, for
	// sandboxes whose policy says `l7: sni`; default 15001; -1 turns it off (such
	// policies are then enforced at the address level only).
	L7Port int `yaml:"l7Port"`
	// ProxyPort, when set, runs egressd's explicit HTTP proxy on the bridge gateway
	// address at this port and gives every new sandbox HTTP_PROXY / HTTPS_PROXY (and
	// the lower-case twins, NO_PROXY=localhost,127.0.0.1,::1) pointing at it, unless the
	// create request sets them. The proxy applies the sandbox's own policy. Default 0:
	// off.
	ProxyPort int `yaml:"proxyPort"`
	// UpstreamCAFile is a PEM file of extra CA certificates trusted for the upstreams
	// of intercepted (Credential Vault) connections, beside the system roots.
	UpstreamCAFile string `yaml:"upstreamCAFile"`
	// PinRoot is the bpffs directory of the eBPF datapath's pinned state, which keeps
	// enforcing while the daemon restarts; default /sys/fs/bpf/airlock.
	PinRoot string `yaml:"pinRoot"`
	// NFTTable names the nftables tables (inet and netdev) of the nftables datapath;
	// default airlock. Two installations on one host need different pin roots and
	// tables: each adopts, and detaches when they are not its own, the sandboxes it
	// finds there.
	NFTTable string `yaml:"nftTable"`
}

func (c *EgressConfig) setDefaults() error {
	switch enforcer.Mode(c.Mode) {
	case "":
		c.Mode = string(enforcer.ModeAuto)
	case enforcer.ModeAuto, enforcer.ModeEBPF, enforcer.ModeNFTables:
	default:
		return fmt.Errorf("config: egress.mode %q: want auto, ebpf or nftables", c.Mode)
	}
	if c.NFTTable == "" {
		c.NFTTable = nftfilter.TableName
	}
	if err := nftfilter.CheckTableName(c.NFTTable); err != nil {
		return fmt.Errorf("config: egress.nftTable: %w", err)
	}
	switch {
	case c.L7Port == 0:
		c.L7Port = 15001
	case c.L7Port == -1:
	case c.L7Port < 1 || c.L7Port > 65535:
		return fmt.Errorf("config: egress.l7Port %d: want a port, or -1 for off", c.L7Port)
	}
	if c.ProxyPort < 0 || c.ProxyPort > 65535 || (c.ProxyPort != 0 && c.ProxyPort == c.L7Port) {
		return fmt.Errorf("config: egress.proxyPort %d: want a port other than l7Port, or 0 for off", c.ProxyPort)
	}
	for i, u := range c.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			if _, err := netip.ParseAddr(u); err != nil {
				return fmt.Errorf("config: egress.upstreams[%d] %q: want an address or address:port", i, u)
			}
			c.Upstreams[i] = net.JoinHostPort(u, "53")
		}
	}
	return nil
}

// startEgress runs egressd in this process: its DNS filter on the Airlock bridge's
// gateway address (the sandboxes' only resolver, docker.Config.DNSOnGateway), its
// datapath on every sandbox's veth, following lifecycle's watch over loopback. It
// waits for the first snapshot so that sandboxes adopted at start are enforced when
// `airlock up` reports ready.
func (s *Stack) startEgress(ctx context.Context) error {
	e := s.cfg.Egress
	upstreams := e.Upstreams
	if len(upstreams) == 0 {
		var err error
		if upstreams, err = egressd.HostResolvers("/etc/resolv.conf"); err != nil {
			return err
		}
	}
	_, _, gw := s.Docker.Network()
	if !gw.IsValid() {
		return fmt.Errorf("the Docker network has no gateway address for the DNS filter")
	}
	ov := policies.BaseOverlay()
	ov.DenyAddrs(egressd.HostAddrs()...)
	hdr := http.Header{}
	if s.APIKey != "" {
		hdr.Set("OPEN-SANDBOX-API-KEY", s.APIKey)
	}
	var upstreamCA []byte
	if e.UpstreamCAFile != "" {
		var err error
		if upstreamCA, err = os.ReadFile(e.UpstreamCAFile); err != nil {
			return fmt.Errorf("egress.upstreamCAFile: %w", err)
		}
	}
	var credVault egressd.CredentialVault
	if s.Vault != nil {
		credVault = s.Vault
	}
	d, err := egressd.New(egressd.Config{
		Vault:         credVault,
		UpstreamCAPEM: upstreamCA,
		Watch:         watch.ClientConfig{URL: "http://" + loopbackAddr(s.Addr) + "/internal/v1/watch", Header: hdr, Log: s.log.With("component", "egress-watch")},
		Enforcer:      enforcer.Config{Mode: enforcer.Mode(e.Mode), EBPF: egressbpf.Config{PinRoot: e.PinRoot}, NFT: nftfilter.Config{Table: e.NFTTable}},
		DNSListen:     netip.AddrPortFrom(gw, 53).String(),
		L7Port:        uint16(max(e.L7Port, 0)),
		ProxyPort:     uint16(e.ProxyPort),
		Upstreams:     upstreams,
		Overlay:       ov,
		Audit:         s.Audit,
		Registry:      s.registry,
		Logger:        s.log.With("component", "egressd"),
	})
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
	s.egress.Store(d)
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
