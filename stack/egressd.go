package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/ebpf"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/egressd/ctrsnap"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// EgressdConfig configures the egress daemon (package egressd) wherever it runs: the
// egress section of airlock.yaml for `airlock up`, the flags of `airlock egressd`. A
// setting with a YAML key means the same on both paths, and DefaultEgressdConfig holds
// every default (the flags of `airlock egressd` show them). The fields without a YAML
// key say where the daemon runs: airlock up sets them from its own API listener and
// Docker bridge, the standalone command from its flags.
type EgressdConfig struct {
	// Disabled turns egress enforcement off in airlock up: sandboxes then use Docker's
	// resolvers and reach whatever the host reaches. Say so loudly to whoever runs
	// agents.
	Disabled bool `yaml:"disabled"`
	// Mode picks the datapath: auto (the default: eBPF, nftables when eBPF cannot
	// attach), ebpf or nftables.
	Mode string `yaml:"mode"`
	// Upstreams are the resolvers allowed names are forwarded to ("host:port", or
	// "host" for port 53); default none: the nameservers of the host's
	// /etc/resolv.conf, read at start.
	Upstreams []string `yaml:"upstreams"`
	// L7Port is the port of the transparent L7 (TLS SNI / HTTP Host) proxy on the
	// resolver address, for sandboxes whose policy says `l7: sni` and for the Credential
	// Vault; default 15001. 0 turns it off: such policies are then enforced at the
	// address level only, and airlock up has no Credential Vault. (Before, -1 meant off
	// in airlock.yaml; it is refused now.)
	L7Port int `yaml:"l7Port"`
	// ProxyPort, when not 0, runs the explicit HTTP proxy on the resolver address at
	// this port; it applies the sandbox's own policy to each CONNECT or http:// request.
	// airlock up also gives every new sandbox HTTP_PROXY / HTTPS_PROXY (and the
	// lower-case twins, NO_PROXY=localhost,127.0.0.1,::1) pointing at it, unless the
	// create request sets them. Default 0: off.
	ProxyPort int `yaml:"proxyPort"`
	// UpstreamCAFile is a PEM file of extra CA certificates trusted for the upstreams
	// of intercepted (Credential Vault) connections, beside the system roots (airlock
	// up, and `airlock egressd --upstream-ca-file` with --vault-dir).
	UpstreamCAFile string `yaml:"upstreamCAFile"`
	// VaultPlainHTTP is vault.plainHTTP of airlock.yaml (`--vault-plain-http`): to
	// which addresses a plain-HTTP request for a bound host may carry a credential,
	// learned (the default) or policy (egressd.PlainHTTPMode). It matters where the
	// daemon has a Credential Vault (airlock up, or VaultDir).
	VaultPlainHTTP string `yaml:"-"`
	// PinRoot is the bpffs directory of the eBPF datapath's pinned state, which keeps
	// enforcing while the daemon restarts; default /sys/fs/bpf/airlock.
	PinRoot string `yaml:"pinRoot"`
	// AttributionDisabled turns process attribution of flow records off (eBPF
	// datapath: no sock_ops program, no per-flow process entries; nftables datapath:
	// the socket programs are not loaded recording only; records then carry no
	// extra.process). Default false: on.
	AttributionDisabled bool `yaml:"attributionDisabled"`
	// NFTTable names the nftables tables (inet and netdev) of the nftables datapath;
	// default airlock. Two installations on one host need different pin roots and
	// tables: each adopts, and detaches when they are not its own, the sandboxes it
	// finds there.
	NFTTable string `yaml:"nftTable"`
	// Deny are extra always-deny targets of the operator overlay (an address, a CIDR
	// or a name), on top of policies.BuiltinDeny and this host's own addresses, which
	// are always denied; for example the control plane's network. Default none.
	Deny []string `yaml:"deny"`
	// DNSGuard is the DNS tunnelling guard every sandbox gets on top of its policy's
	// dns.tunnelGuard (package dnsfilter, GuardConfig): distinct names per sandbox,
	// per registrable domain (eTLD+1) and per rule, each a minute; and the highest
	// label score in bits. Defaults 300, 100, 200 and 160; a negative value turns
	// that check off.
	DNSGuard DNSGuard `yaml:"dnsGuard"`

	// WatchURL is lifecycle's watch stream (…/internal/v1/watch), followed with
	// APIKey (sent as OPEN-SANDBOX-API-KEY; empty: none). airlock up: its own API over
	// loopback.
	WatchURL string `yaml:"-"`
	APIKey   string `yaml:"-"`
	// WatchFallbackURL is followed while WatchURL cannot be reached (Kubernetes: every
	// lifecycle replica's Service behind the leader's); empty: none.
	WatchFallbackURL string `yaml:"-"`
	// DNSListen is the DNS filter's address, normally the Airlock bridge's gateway
	// address port 53 (airlock up: always). Default with DNSLocalAddress: that address,
	// port 53.
	DNSListen string `yaml:"-"`
	// Resolver is the address sandboxes send DNS to; default DNSLocalAddress, else
	// DNSListen's host.
	Resolver netip.Addr `yaml:"-"`
	// DNSLocalAddress, when valid, is the node-local DNS address of a Kubernetes node
	// (169.254.20.10, the pods' dnsConfig nameserver), put on the dummy interface
	// DNSInterface (default egressd.DefaultDNSInterface, "airlock-dns").
	DNSLocalAddress netip.Addr `yaml:"-"`
	DNSInterface    string     `yaml:"-"`
	// Node is this node's name; sandboxes of other nodes are ignored. Empty: one host.
	Node string `yaml:"-"`
	// CgroupRoot is the node's cgroup hierarchy as egressd sees it, where a pod's cgroup
	// is found (egressd.Config.CgroupRoot); empty: egressd's own cgroup2 mount.
	CgroupRoot string `yaml:"-"`
	// MetricsListen, when set, serves /metrics, /healthz (503 until the first watch
	// snapshot is programmed) and watch.EnforcedPath<id> (which lifecycle replicas on
	// Kubernetes ask before releasing a sandbox) on this address. airlock up serves its
	// metrics on the API listener instead.
	MetricsListen string `yaml:"-"`
	// Audit is the audit log NewEgressd opens when AuditWriter is nil (empty Dir: no
	// audit).
	Audit AuditConfig `yaml:"-"`

	// AuditWriter, when set, is the audit log to write to (airlock up's shared one);
	// the caller closes it.
	AuditWriter *audit.Writer `yaml:"-"`
	// Vault is the Credential Vault (airlock up); nil: none.
	Vault egressd.CredentialVault `yaml:"-"`
	// VaultDir, when set and Vault is nil, is where NewEgressd opens a Credential Vault
	// of its own (vault.Open: the node key and each sandbox's sealed vault), which Run
	// serves to lifecycle replicas on MetricsListen (watch.VaultPath, behind APIKey):
	// `airlock egressd --vault-dir` on Kubernetes. Empty: none.
	VaultDir string `yaml:"-"`
	// ContainerdSocket, when set with APIKey, is the node's containerd socket, through
	// which Run serves the snapshot node API on MetricsListen (watch.SnapshotPath,
	// egressd.SnapshotHandler): lifecycle replicas on Kubernetes commit a sandbox pod's
	// container into a node-local image there. ContainerdNamespace is the kubelet's
	// containerd namespace; default k8s.io. `airlock egressd --containerd-socket`.
	ContainerdSocket    string `yaml:"-"`
	ContainerdNamespace string `yaml:"-"`
	// Registry receives the metrics; nil: a new registry with the Go and process
	// collectors.
	Registry *prometheus.Registry `yaml:"-"`
	// Log is the daemon's logger; nil discards.
	Log *slog.Logger `yaml:"-"`
}

// DNSGuard is egress.dnsGuard in airlock.yaml (dnsfilter.GuardConfig).
type DNSGuard struct {
	NamesPerSandbox int     `yaml:"namesPerSandbox"`
	NamesPerDomain  int     `yaml:"namesPerDomain"`
	NamesPerRule    int     `yaml:"namesPerRule"`
	MaxLabelBits    float64 `yaml:"maxLabelBits"`
}

// guard is g as dnsfilter takes it.
func (g DNSGuard) guard() dnsfilter.GuardConfig {
	return dnsfilter.GuardConfig{NamesPerSandbox: g.NamesPerSandbox, NamesPerDomain: g.NamesPerDomain,
		NamesPerRule: g.NamesPerRule, MaxLabelBits: g.MaxLabelBits}
}

// DefaultEgressdConfig is every default of egressd, for airlock.yaml and for the flags
// of `airlock egressd` alike.
func DefaultEgressdConfig() EgressdConfig {
	return EgressdConfig{
		Mode:         string(enforcer.ModeAuto),
		L7Port:       15001,
		PinRoot:      ebpf.DefaultPinRoot,
		NFTTable:     nftfilter.TableName,
		DNSInterface: egressd.DefaultDNSInterface,
		DNSGuard: DNSGuard{NamesPerSandbox: dnsfilter.DefaultNamesPerSandbox, NamesPerDomain: dnsfilter.DefaultNamesPerDomain,
			NamesPerRule: dnsfilter.DefaultNamesPerRule, MaxLabelBits: dnsfilter.DefaultMaxLabelBits},
		Audit: DefaultAuditConfig(),
	}
}

// Resolved is c with what is empty filled from DefaultEgressdConfig (a Go literal
// config leaves strings empty; L7Port and ProxyPort 0 stay off) and checked; upstreams
// without a port get port 53. Errors name the airlock.yaml key and the flag.
func (c EgressdConfig) Resolved() (EgressdConfig, error) {
	d := DefaultEgressdConfig()
	switch enforcer.Mode(c.Mode) {
	case "":
		c.Mode = d.Mode
	case enforcer.ModeAuto, enforcer.ModeEBPF, enforcer.ModeNFTables:
	default:
		return c, fmt.Errorf("config: egress.mode (--mode) %q: want auto, ebpf or nftables", c.Mode)
	}
	if c.PinRoot == "" {
		c.PinRoot = d.PinRoot
	}
	if c.NFTTable == "" {
		c.NFTTable = d.NFTTable
	}
	if err := nftfilter.CheckTableName(c.NFTTable); err != nil {
		return c, fmt.Errorf("config: egress.nftTable (--nft-table): %w", err)
	}
	if c.DNSInterface == "" {
		c.DNSInterface = d.DNSInterface
	}
	switch {
	case c.L7Port == -1:
		return c, fmt.Errorf("config: egress.l7Port (--l7-port) -1: 0 turns the L7 proxy off now")
	case c.L7Port < 0 || c.L7Port > 65535:
		return c, fmt.Errorf("config: egress.l7Port (--l7-port) %d: want a port, or 0 for off", c.L7Port)
	}
	if c.ProxyPort < 0 || c.ProxyPort > 65535 || (c.ProxyPort != 0 && c.ProxyPort == c.L7Port) {
		return c, fmt.Errorf("config: egress.proxyPort (--proxy-port) %d: want a port other than l7Port, or 0 for off", c.ProxyPort)
	}
	plain, err := egressd.ParsePlainHTTPMode(c.VaultPlainHTTP)
	if err != nil {
		return c, fmt.Errorf("config: %w (--vault-plain-http)", err)
	}
	c.VaultPlainHTTP = string(plain)
	c.Upstreams = slices.Clone(c.Upstreams)
	for i, u := range c.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			if _, err := netip.ParseAddr(u); err != nil {
				return c, fmt.Errorf("config: egress.upstreams[%d] (--upstream) %q: want an address or address:port", i, u)
			}
			c.Upstreams[i] = net.JoinHostPort(u, "53")
		}
	}
	if err := policies.BaseOverlay().Deny(c.Deny...); err != nil {
		return c, fmt.Errorf("config: egress.deny (--deny): %w", err)
	}
	if c.Audit, err = c.Audit.resolved(); err != nil {
		return c, err
	}
	return c, nil
}

// Overlay is the operator overlay every sandbox policy is compiled under:
// policies.BaseOverlay, this host's addresses and Deny. The console shows policies
// under the same overlay.
func (c EgressdConfig) Overlay() (*policies.Overlay, error) {
	ov := policies.BaseOverlay()
	ov.DenyAddrs(egressd.HostAddrs()...)
	if err := ov.Deny(c.Deny...); err != nil {
		return nil, fmt.Errorf("egress.deny: %w", err)
	}
	return ov, nil
}

// Egressd is an egress daemon built by NewEgressd, with what it owns.
type Egressd struct {
	*egressd.Daemon
	// Upstreams are the resolvers in use (the configured ones, else the host's).
	Upstreams []string
	// Registry holds the daemon's metrics.
	Registry *prometheus.Registry

	cfg      EgressdConfig
	ownAudit *audit.Writer // opened by NewEgressd from cfg.Audit
	ownVault *vault.Store  // opened by NewEgressd from cfg.VaultDir
}

// NewEgressd builds the egress daemon of cfg: its audit log (cfg.AuditWriter, else one
// opened from cfg.Audit), metrics registry, operator overlay, upstreams and datapath.
// It needs cfg.WatchURL and cfg.DNSListen or cfg.DNSLocalAddress. Run it with Run.
func NewEgressd(cfg EgressdConfig) (*Egressd, error) {
	cfg, err := cfg.Resolved()
	if err != nil {
		return nil, err
	}
	if cfg.WatchURL == "" || (cfg.DNSListen == "" && !cfg.DNSLocalAddress.IsValid()) {
		return nil, errors.New("egressd: a watch URL and a DNS address (DNSListen or DNSLocalAddress) are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	e := &Egressd{cfg: cfg, Upstreams: cfg.Upstreams, Registry: cfg.Registry}
	if e.Registry == nil {
		e.Registry = newRegistry()
	}
	if len(e.Upstreams) == 0 {
		if e.Upstreams, err = egressd.HostResolvers("/etc/resolv.conf"); err != nil {
			return nil, err
		}
	}
	ov, err := cfg.Overlay()
	if err != nil {
		return nil, err
	}
	var upstreamCA []byte
	if cfg.UpstreamCAFile != "" {
		if upstreamCA, err = os.ReadFile(cfg.UpstreamCAFile); err != nil {
			return nil, fmt.Errorf("egress.upstreamCAFile: %w", err)
		}
	}
	hdr := http.Header{}
	if cfg.APIKey != "" {
		hdr.Set(opensandbox.HeaderAPIKey, cfg.APIKey)
	}
	var sink egressd.AuditSink
	switch {
	case cfg.AuditWriter != nil:
		sink = cfg.AuditWriter
	case cfg.Audit.Dir != "":
		if e.ownAudit, err = OpenAudit(cfg.Audit, e.Registry, cfg.Log.With("component", "audit")); err != nil {
			return nil, err
		}
		sink = e.ownAudit
	default:
		cfg.Log.Warn("no audit log: DNS and connection decisions are not recorded (set an audit directory)")
	}
	if cfg.Vault == nil && cfg.VaultDir != "" {
		if e.ownVault, err = vault.Open(cfg.VaultDir, cfg.Log.With("component", "vault")); err != nil {
			return nil, errors.Join(err, e.closeAudit())
		}
		e.ownVault.OnChange(func(c vault.Change) { auditVaultChange(sink, c) })
		cfg.Vault = e.ownVault
	}
	e.Daemon, err = egressd.New(egressd.Config{
		Watch: watch.ClientConfig{URL: cfg.WatchURL, FallbackURL: cfg.WatchFallbackURL, Header: hdr,
			Log: cfg.Log.With("component", "watch")},
		Enforcer:       enforcer.Config{Mode: enforcer.Mode(cfg.Mode), EBPF: ebpf.Config{PinRoot: cfg.PinRoot, NoAttribution: cfg.AttributionDisabled}, NFT: nftfilter.Config{Table: cfg.NFTTable}},
		DNSListen:      cfg.DNSListen,
		Resolver:       cfg.Resolver,
		LocalDNS:       cfg.DNSLocalAddress,
		DNSInterface:   cfg.DNSInterface,
		Upstreams:      e.Upstreams,
		Overlay:        ov,
		L7Port:         uint16(cfg.L7Port),
		ProxyPort:      uint16(cfg.ProxyPort),
		Vault:          cfg.Vault,
		OnDelete:       e.forgetVault,
		VaultPlainHTTP: egressd.PlainHTTPMode(cfg.VaultPlainHTTP),
		UpstreamCAPEM:  upstreamCA,
		Node:           cfg.Node,
		CgroupRoot:     cfg.CgroupRoot,
		Audit:          sink,
		Registry:       e.Registry,
		Logger:         cfg.Log,
	})
	if err != nil {
		return nil, errors.Join(err, e.closeAudit())
	}
	return e, nil
}

// Run serves DNS and enforces the sandboxes it follows until ctx ends (then every
// sandbox stays enforced, fail closed), with the metrics listener when
// EgressdConfig.MetricsListen is set; it closes the audit log NewEgressd opened. A
// stop by ctx returns nil.
func (e *Egressd) Run(ctx context.Context) error {
	if e.cfg.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(e.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !e.Synced() {
				http.Error(w, "waiting for the first watch snapshot", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		mux.Handle("GET "+watch.EnforcedPath+"{id}", e.StatusHandler())
		if e.ownVault != nil && e.cfg.APIKey != "" {
			mux.Handle(watch.VaultPath, e.VaultHandler(e.ownVault, e.cfg.APIKey))
		}
		if e.cfg.APIKey != "" {
			// The gateway on Kubernetes asks for the process groups of execd commands.
			mux.Handle(execdaudit.GroupsPath, e.GroupsHandler(e.cfg.APIKey))
		}
		if e.cfg.ContainerdSocket != "" && e.cfg.APIKey != "" {
			ns := cmp.Or(e.cfg.ContainerdNamespace, "k8s.io")
			ctr, err := ctrsnap.New(e.cfg.ContainerdSocket, ns)
			if err != nil {
				return errors.Join(err, e.closeAudit())
			}
			defer ctr.Close()
			mux.Handle(watch.SnapshotPath, e.SnapshotHandler(ctr, e.cfg.APIKey))
		}
		defer serveHTTP(e.cfg.MetricsListen, mux, e.cfg.Log).Close()
	}
	err := e.Daemon.Run(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return errors.Join(err, e.closeAudit())
}

// Close releases the daemon's handles (sandboxes stay enforced) and closes the audit
// log NewEgressd opened; for a daemon that never ran. Safe to call more than once.
func (e *Egressd) Close() error {
	return errors.Join(e.Daemon.Close(), e.closeAudit())
}

// forgetVault drops a deleted sandbox's vault from the daemon's own store (VaultDir);
// airlock up's lifecycle forgets the vault it shares with egressd itself.
func (e *Egressd) forgetVault(id string) {
	if e.ownVault == nil {
		return
	}
	if err := e.ownVault.Delete(id); err != nil {
		e.cfg.Log.Error("deleting a sandbox's credential vault failed", "sandbox_id", id, "err", err)
	}
}

func (e *Egressd) closeAudit() error {
	if e.ownAudit == nil {
		return nil
	}
	return e.ownAudit.Close() // safe more than once
}

// newRegistry is a metrics registry with the Go and process collectors, for a server
// that runs alone.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
