// Package egressd is the node's egress daemon (docs/architecture.md#egressd): it follows
// the lifecycle watch API, attaches the egress datapath (package egressd/enforcer: eBPF,
// or nftables) to every sandbox of this node, serves the DNS filter (package dnsfilter)
// that is the sandboxes' only resolver, writes the addresses of allowed answers into the
// datapath before the answer leaves, applies policy changes to running sandboxes, and
// audits every DNS decision and every new or dropped connection.
//
// Enforcement outlives the daemon: Close (or a crash) leaves every attached sandbox
// enforced with its last policy and learned entries (fail closed); the next Daemon on
// the same node adopts that state without a gap and detaches what vanished meanwhile.
package egressd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

// DefaultPolicy is what a sandbox created without a network policy gets: everything
// allowed except the operator overlay and special addresses, as OpenSandbox does when
// no networkPolicy is given.
var DefaultPolicy = json.RawMessage(`{"defaultAction":"allow","egress":[]}`)

// ErrConfig wraps configuration errors from New.
var ErrConfig = errors.New("egressd: invalid configuration")

// AuditSink receives one record per decision; Append must not block (audit.Writer).
type AuditSink interface{ Append(audit.Record) }

// Config configures a Daemon.
type Config struct {
	// Watch is the lifecycle watch feed (URL of /internal/v1/watch and its credential).
	Watch watch.ClientConfig
	// Enforcer configures the datapath (Mode auto, ebpf or nftables). Ignored when
	// Datapath is set.
	Enforcer enforcer.Config
	// Datapath, when set, is used instead of building one from Enforcer; the Daemon
	// closes it.
	Datapath datapath.Datapath
	// DNSListen is the DNS filter's UDP and TCP address, normally the Airlock bridge's
	// gateway address, port 53 ("172.30.0.1:53"). Default with LocalDNS: LocalDNS
	// port 53.
	DNSListen string
	// Resolver is the address sandboxes send DNS to (the only port-53 destination the
	// datapath lets through); default LocalDNS, else DNSListen's host.
	Resolver netip.Addr
	// LocalDNS, when valid, is the node-local DNS address of a Kubernetes node (usually
	// DefaultLocalDNS, 169.254.20.10), the nameserver of the pods' dnsConfig. New makes
	// it a local address on the dummy interface DNSInterface (EnsureDNSAddress: created
	// when missing, never removed) before the DNS filter binds to it; pods reach it
	// through their host-side veth. Invalid (zero): no interface is touched.
	LocalDNS netip.Addr
	// DNSInterface names the dummy interface carrying LocalDNS, at most 15 bytes;
	// default DefaultDNSInterface ("airlock-dns").
	DNSInterface string
	// Upstreams are the resolvers allowed names are forwarded to ("host:port").
	Upstreams []string
	// Overlay is the operator overlay every sandbox policy is compiled under; nil means
	// policies.BaseOverlay() (cloud metadata, link-local, loopback...). Callers add the
	// host's addresses and the control plane.
	Overlay *policies.Overlay
	// DefaultPolicy is the policy document of sandboxes that have none; nil means
	// DefaultPolicy (allow, minus the overlay and special addresses).
	DefaultPolicy json.RawMessage
	// L7Port, when set, is the port of the transparent L7 proxy on Resolver: sandboxes
	// whose policy says `l7: sni` get their TCP 80/443 (what no static rule decided)
	// redirected to it, and it lets a connection through only when its TLS SNI or HTTP
	// Host is allowed and the destination was learned for that name. Zero: no proxy, and
	// `l7: sni` policies are enforced at the address level only.
	L7Port uint16
	// ProxyPort, when set, is the port of the explicit HTTP proxy on Resolver that
	// sandboxes reach through HTTP_PROXY / HTTPS_PROXY (the caller injects those; see
	// lifecycle.Config.DefaultEnv). Every sandbox may connect to it; it applies the
	// sandbox's policy to each CONNECT or http:// request. Zero: no proxy.
	ProxyPort uint16
	// Vault, when set with L7Port, is the Credential Vault: sandboxes created with
	// credentialProxy.enabled get their TCP 80/443 redirected to the L7 proxy, which
	// intercepts connections to destinations that have a binding and injects the
	// binding's credential (see credentialProxy). Nil: no interception.
	Vault CredentialVault
	// OnDelete, when set, is called with the id of each sandbox that left the watch
	// (deleted, or missing from a snapshot), after it is detached: `airlock egressd
	// --vault-dir` forgets the sandbox's vault there. State changes do not call it.
	OnDelete func(id string)
	// VaultPlainHTTP is vault.plainHTTP: to which addresses a plain-HTTP request for a
	// bound host may carry a credential (PlainHTTPMode; "" is PlainHTTPLearned).
	VaultPlainHTTP PlainHTTPMode
	// UpstreamCAPEM holds extra PEM CA certificates trusted for intercepted upstreams,
	// beside the system roots (tests, private PKI).
	UpstreamCAPEM []byte
	// Node is this node's name; sandboxes of other nodes are ignored. Empty on one host.
	Node string
	// CgroupRoot is the node's cgroup hierarchy as this process sees it, where a pod's
	// cgroup is found by its UID (cgroupv2.OfPod: kubelet's cgroupfs or systemd layout):
	// a cgroup v2 directory, or one holding it at unified/ (a hybrid host). A DaemonSet
	// mounts the node's /sys/fs/cgroup there (hostPath). Empty: the cgroup2 mount of this
	// mount namespace. Docker sandboxes' cgroups are found from their process instead.
	CgroupRoot string
	// MinTTL and MaxTTL clamp how long a learned address stays allowed (dnsfilter
	// defaults 30 s and 600 s).
	MinTTL, MaxTTL time.Duration
	// DNSGuard is the operator's part of the DNS tunnelling guard (distinct-name caps
	// and the label score), on top of each policy's dns.tunnelGuard; zero fields take
	// dnsfilter's defaults, negative ones turn a check off.
	DNSGuard dnsfilter.GuardConfig
	// Audit receives DNS, connection and policy records; nil means none.
	Audit AuditSink
	// FlowAuditRate and FlowAuditBurst limit the flow records (bpf source) one sandbox
	// may open, per second and in a burst; what goes over is counted in a
	// "suppressed" record (audit/README.md). Defaults DefaultFlowAuditRate and
	// DefaultFlowAuditBurst.
	FlowAuditRate  float64
	FlowAuditBurst int
	// Registry receives the airlock_egressd_* and airlock_dnsfilter_* metrics.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Daemon is a running egressd. Create it with New, run it with Run, stop it with Close.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	dp       datapath.Datapath
	claim    *enforcer.Claim // the datapath's host state; nil with Config.Datapath
	dns      *dnsfilter.Server
	watch    *watch.Client
	resolver netip.Addr
	fallback json.RawMessage
	metrics  *metrics
	l7       *l7Proxy         // nil without Config.L7Port
	cred     *credentialProxy // nil without Config.Vault and L7Port
	proxy    *explicitProxy   // nil without Config.ProxyPort

	// applyMu serialises apply and remove (the watch handler and the retry loop);
	// mu guards the tables the DNS path reads.
	applyMu sync.Mutex
	mu      sync.RWMutex
	byID    map[string]*sandbox
	byAddr  map[netip.Addr]*sandbox
	// batch queues policy changes applied together (batch.go).
	batch *batcher

	closeOnce sync.Once
}

// New validates cfg, builds (or takes) the datapath and binds the DNS filter's
// sockets. It attaches nothing: Run follows the watch.
func New(cfg Config) (*Daemon, error) {
	if cfg.FlowAuditRate <= 0 {
		cfg.FlowAuditRate = DefaultFlowAuditRate
	}
	if cfg.FlowAuditBurst <= 0 {
		cfg.FlowAuditBurst = DefaultFlowAuditBurst
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LocalDNS.IsValid() {
		cfg.LocalDNS = cfg.LocalDNS.Unmap()
		if cfg.DNSListen == "" {
			cfg.DNSListen = netip.AddrPortFrom(cfg.LocalDNS, 53).String()
		}
		if !cfg.Resolver.IsValid() {
			cfg.Resolver = cfg.LocalDNS
		}
		if cfg.DNSInterface == "" {
			cfg.DNSInterface = DefaultDNSInterface
		}
	}
	if cfg.DNSListen == "" {
		return nil, fmt.Errorf("%w: DNSListen or LocalDNS is required", ErrConfig)
	}
	if len(cfg.Upstreams) == 0 {
		return nil, fmt.Errorf("%w: at least one upstream resolver is required", ErrConfig)
	}
	resolver := cfg.Resolver
	if !resolver.IsValid() {
		host, _, err := net.SplitHostPort(cfg.DNSListen)
		if err != nil {
			return nil, fmt.Errorf("%w: DNSListen %q: %v", ErrConfig, cfg.DNSListen, err)
		}
		if resolver, err = netip.ParseAddr(host); err != nil || resolver.IsUnspecified() {
			return nil, fmt.Errorf("%w: DNSListen %q is not a concrete address; set Resolver", ErrConfig, cfg.DNSListen)
		}
	}
	if cfg.LocalDNS.IsValid() && resolver != cfg.LocalDNS {
		return nil, fmt.Errorf("%w: Resolver %s is not LocalDNS %s", ErrConfig, resolver, cfg.LocalDNS)
	}
	if cfg.Overlay == nil {
		cfg.Overlay = policies.BaseOverlay()
	}
	fallback := cfg.DefaultPolicy
	if len(fallback) == 0 {
		fallback = DefaultPolicy
	}
	if _, err := policies.Load("default policy", fallback, policies.CompileOptions{Overlay: cfg.Overlay}); err != nil {
		return nil, fmt.Errorf("%w: default policy: %v", ErrConfig, err)
	}
	if cfg.LocalDNS.IsValid() {
		// Before anything binds on the resolver address (DNS, L7, explicit proxy).
		if err := EnsureDNSAddress(cfg.DNSInterface, cfg.LocalDNS); err != nil {
			return nil, fmt.Errorf("egressd: node-local DNS address: %w", err)
		}
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	wc, err := watch.NewClient(cfg.Watch)
	if err != nil {
		return nil, fmt.Errorf("%w: watch: %v", ErrConfig, err)
	}
	d := &Daemon{
		cfg: cfg, log: cfg.Logger, watch: wc, resolver: resolver, fallback: fallback, metrics: m,
		byID: map[string]*sandbox{}, byAddr: map[netip.Addr]*sandbox{}, batch: newBatcher(),
	}
	d.dp = cfg.Datapath
	if d.dp == nil {
		ec := cfg.Enforcer
		ec.L7ProxyPort = cfg.L7Port
		if cfg.LocalDNS.IsValid() && resolver.Unmap().Is4() {
			// A Kubernetes node: the proxy listens on the node-local resolver address,
			// not on the pod's veth, where a redirect to the incoming interface lands.
			ec.L7ProxyAddr = resolver
		}
		if ec.Logger == nil {
			ec.Logger = cfg.Logger.With("component", "datapath")
		}
		// The tables and pin root are this process's (ErrInUse when a live egressd
		// has them); state a dead one left is replaced or adopted.
		if d.claim, err = enforcer.ClaimHost(ec); err != nil {
			return nil, fmt.Errorf("egressd: datapath: %w", err)
		}
		if d.dp, err = enforcer.New(ec); err != nil {
			d.claim.Done(1) // keep what is there: it may enforce sandboxes
			return nil, fmt.Errorf("egressd: datapath: %w", err)
		}
	}
	if cfg.L7Port != 0 {
		if d.l7, err = newL7Proxy(d, netip.AddrPortFrom(resolver, cfg.L7Port).String()); err != nil {
			d.closeDatapath()
			return nil, err
		}
		if cfg.Vault != nil {
			if d.cred, err = newCredentialProxy(d); err != nil {
				d.l7.close()
				d.closeDatapath()
				return nil, err
			}
		}
	}
	if cfg.ProxyPort != 0 {
		if d.proxy, err = newExplicitProxy(d, netip.AddrPortFrom(resolver, cfg.ProxyPort).String()); err != nil {
			if d.l7 != nil {
				d.l7.close()
			}
			d.closeDatapath()
			return nil, err
		}
	}
	var sink dnsfilter.AuditSink
	if cfg.Audit != nil {
		sink = cfg.Audit
	}
	d.dns, err = dnsfilter.New(dnsfilter.Config{
		Addr: cfg.DNSListen, Upstreams: cfg.Upstreams, Lookup: d.lookup, Learn: d.learn,
		Audit: sink, MinTTL: cfg.MinTTL, MaxTTL: cfg.MaxTTL, Registry: cfg.Registry, Guard: cfg.DNSGuard,
		Logger: cfg.Logger.With("component", "dnsfilter"),
	})
	if err != nil {
		if d.l7 != nil {
			d.l7.close()
		}
		if d.proxy != nil {
			d.proxy.close()
		}
		d.closeDatapath()
		return nil, fmt.Errorf("egressd: dns filter: %w", err)
	}
	m.backend(string(d.dp.Backend()))
	d.log.Info("egressd ready", "backend", d.dp.Backend(), "dns", d.dns.Addr(), "resolver", resolver,
		"adopted", len(d.dp.Attached()))
	return d, nil
}

// Backend names the datapath in use (ebpf or nftables).
func (d *Daemon) Backend() datapath.Backend { return d.dp.Backend() }

// DNSAddr is the DNS filter's bound address.
func (d *Daemon) DNSAddr() netip.AddrPort { return d.dns.Addr() }

// ProxyAddr is the explicit proxy's bound address; invalid without Config.ProxyPort.
func (d *Daemon) ProxyAddr() netip.AddrPort {
	if d.proxy == nil {
		return netip.AddrPort{}
	}
	return d.proxy.addr()
}

// Datapath exposes the datapath, for tests and diagnostics.
func (d *Daemon) Datapath() datapath.Datapath { return d.dp }

// Synced reports whether the first watch snapshot has been applied.
func (d *Daemon) Synced() bool { return d.watch.Status().Synced }

// Run serves DNS, audits datapath events, retries failed attaches and follows the
// watch until ctx ends or Close is called. It returns nil on a clean stop.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	dnsErr := make(chan error, 1)
	wg.Go(func() { dnsErr <- d.dns.Run(ctx) })
	wg.Go(d.auditEvents)
	if d.l7 != nil {
		wg.Go(func() { d.l7.run(ctx) })
	}
	if d.proxy != nil {
		wg.Go(func() { d.proxy.run(ctx) })
	}
	wg.Go(func() { d.retry(ctx) })
	wg.Go(func() { d.runBatcher(ctx) })
	wg.Go(func() { _ = d.watch.Run(ctx, handler{d}) })
	var err error
	select {
	case <-ctx.Done():
	case err = <-dnsErr:
		if err != nil {
			err = fmt.Errorf("egressd: dns filter: %w", err)
		}
	}
	cancel()
	d.Close()
	wg.Wait()
	return err
}

// Close stops DNS and event delivery and releases the datapath's handles. Every
// attached sandbox stays enforced (fail closed). Safe to call more than once.
func (d *Daemon) Close() error {
	var err error
	d.closeOnce.Do(func() {
		err = errors.Join(d.dns.Close(), d.closeDatapath())
		if d.l7 != nil {
			err = errors.Join(err, d.l7.close())
		}
		if d.proxy != nil {
			err = errors.Join(err, d.proxy.close())
		}
	})
	return err
}

// closeDatapath closes the datapath, then ends the host claim: with no sandbox
// attached the tables and pinned state are removed (enforcer.Claim.Done).
func (d *Daemon) closeDatapath() error {
	n := len(d.dp.Attached())
	err := d.dp.Close()
	d.claim.Done(n)
	return err
}

// retry attaches sandboxes whose attach failed (a veth not yet visible, a transient
// kernel error) every second until they are attached or gone.
func (d *Daemon) retry(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.mu.RLock()
		var todo []watch.Sandbox
		for _, sb := range d.byID {
			if !sb.attached {
				todo = append(todo, sb.view)
			}
		}
		d.mu.RUnlock()
		for _, v := range todo {
			d.apply(v)
		}
	}
}
