// Package dnsfilter is the only resolver a sandbox has (docs/architecture.md#dns-filter):
// a DNS server on UDP and TCP that identifies the sandbox by the query's source address,
// checks every query against the sandbox's compiled policy (package policies), forwards
// allowed names to the upstream resolvers (cache honouring TTLs, singleflight, failover,
// TCP on truncation), filters the answers (CNAME chains hop by hop, rebinding addresses
// dropped), hands the learned addresses to a hook that programs enforcement BEFORE the
// answer is released, and audits each decision.
//
// Answers, in order of the checks (RFC 1035 §4.1.1 rcodes):
//
//	unknown source address                    REFUSED
//	not one question / not QUERY / not IN     FORMERR / NOTIMP / NOTIMP
//	name too long, high-entropy label,        REFUSED (tunnelling guard)
//	label scoring as encoded data
//	query type not allowed by the policy     NOTIMP (Config.QTypeRcode: REFUSED)
//	name denied by the policy                NXDOMAIN (Config.DenyRcode: REFUSED),
//	                                          no upstream traffic at all
//	a new name over a cap of distinct names   REFUSED (tunnelling guard)
//	per minute (sandbox, registrable
//	domain, rule; GuardConfig)
//	CNAME hop to a denied name               the deny rcode
//	upstream failure, learning hook failure  SERVFAIL
//
// Denials carry an Extended DNS Error (RFC 8914: Blocked/Prohibited) when the client
// sent EDNS. In report mode (policy mode report) policy, query-type and guard denials
// are answered normally and audited with would_deny; the overlay and the rebinding
// guard are enforced in every mode. The policy is looked up per query, so a policy
// change applies to the next query.
package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// Sandbox is what Lookup returns for a known source address.
type Sandbox struct {
	ID string
	// Policy is the sandbox's compiled policy (never nil for a known sandbox).
	Policy *policies.Decider
}

// Lookup maps a query's source address to its sandbox. It is called once per query
// and must not perform I/O (egressd answers from its watch-fed table).
type Lookup func(src netip.Addr) (Sandbox, bool)

// Learned is what a DNS answer teaches enforcement.
type Learned struct {
	SandboxID string
	// Name is the query name (normalized: lower case, no trailing dot).
	Name string
	// Chain is the CNAME chain from Name to the owner of the addresses (Name first).
	Chain []string
	// Addrs are the answer's addresses that passed the policy.
	Addrs []netip.Addr
	// TTL is the answer's lowest address TTL clamped to [MinTTL, MaxTTL]; the addresses
	// may be used for that long.
	TTL time.Duration
	// Ports is what the name may reach (policies.Decision.Ports), to program with the
	// addresses.
	Ports policies.PortSet
}

// Learner programs enforcement for learned addresses. It is called before the answer
// is written and the answer waits for it to return; an error means the addresses could
// not be programmed and the client gets SERVFAIL instead of an answer it could not use.
// ctx carries the per-query deadline. l's slices may be shared with other queries
// (prepared answers): the hook must not modify them.
type Learner func(ctx context.Context, l Learned) error

// AuditSink receives one record per decision; Append must not block (audit.Writer).
type AuditSink interface{ Append(audit.Record) }

// Config configures a Server.
type Config struct {
	// Addr is the UDP and TCP listen address ("10.88.0.1:53"); port 0 picks a free port
	// (the same for both), see Server.Addr.
	Addr string
	// Upstreams are the resolvers allowed names are forwarded to ("host:port"), tried in
	// order on failure.
	Upstreams []string
	// UpstreamTimeout bounds one attempt at one upstream; default 2s.
	UpstreamTimeout time.Duration
	// QueryTimeout bounds the whole handling of one query (upstreams and the learning
	// hook); default 5s.
	QueryTimeout time.Duration
	// Lookup identifies the sandbox (required).
	Lookup Lookup
	// Learn is the learning hook (optional).
	Learn Learner
	// Audit receives the decisions (optional).
	Audit AuditSink
	// DenyRcode answers denied names: dns.RcodeNameError (default) or dns.RcodeRefused.
	DenyRcode int
	// QTypeRcode answers disallowed query types: dns.RcodeNotImplemented (default) or
	// dns.RcodeRefused.
	QTypeRcode int
	// MinTTL and MaxTTL clamp learned TTLs; defaults 30s and 600s. Answer TTLs sent to
	// the client never exceed the learned TTL, so a client never uses an address longer
	// than enforcement allows it.
	MinTTL, MaxTTL time.Duration
	// CacheSize is the most answers cached; default 10000; negative disables the cache.
	CacheSize int
	// Guard is the operator's part of the tunnelling guard (distinct-name caps and the
	// label score); the zero value is the defaults, which are on.
	Guard GuardConfig
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives the airlock_dnsfilter_* metrics; nil means none.
	Registry prometheus.Registerer
}

// Errors.
var (
	ErrConfig = errors.New("dnsfilter: invalid configuration")
)

// Server is a running DNS filter. Create it with New, serve with Run, stop with Close.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	cache   *cache
	flight  singleflight.Group
	guard   *nameGuard
	caps    nameCaps
	pools   map[string]*udpPool
	udp     net.PacketConn
	tcp     net.Listener
	tcpSrv  *dns.Server
	// inflight counts the UDP readers and the queries they handed to goroutines.
	inflight sync.WaitGroup
	// work hands queries from the UDP readers to idle workers (udp.go).
	work        chan udpQuery
	idleWorkers atomic.Int32

	closeOnce sync.Once
	done      chan struct{}
}

// New validates cfg and binds the UDP and TCP sockets, so Addr is known before Run.
func New(cfg Config) (*Server, error) {
	if cfg.Lookup == nil {
		return nil, fmt.Errorf("%w: Lookup is required", ErrConfig)
	}
	if len(cfg.Upstreams) == 0 {
		return nil, fmt.Errorf("%w: no upstreams", ErrConfig)
	}
	for _, u := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return nil, fmt.Errorf("%w: upstream %q: %w", ErrConfig, u, err)
		}
	}
	switch cfg.DenyRcode {
	case 0:
		cfg.DenyRcode = dns.RcodeNameError
	case dns.RcodeNameError, dns.RcodeRefused:
	default:
		return nil, fmt.Errorf("%w: DenyRcode must be NXDOMAIN or REFUSED", ErrConfig)
	}
	switch cfg.QTypeRcode {
	case 0:
		cfg.QTypeRcode = dns.RcodeNotImplemented
	case dns.RcodeNotImplemented, dns.RcodeRefused:
	default:
		return nil, fmt.Errorf("%w: QTypeRcode must be NOTIMP or REFUSED", ErrConfig)
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 2 * time.Second
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = 5 * time.Second
	}
	if cfg.MinTTL <= 0 {
		cfg.MinTTL = 30 * time.Second
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = 600 * time.Second
	}
	if cfg.MaxTTL < cfg.MinTTL {
		return nil, fmt.Errorf("%w: MaxTTL %s below MinTTL %s", ErrConfig, cfg.MaxTTL, cfg.MinTTL)
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var err error
	if cfg.Guard, err = cfg.Guard.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, guard: newNameGuard(), done: make(chan struct{}),
		work: make(chan udpQuery)}
	s.caps = nameCaps{sandbox: cfg.Guard.NamesPerSandbox, domain: cfg.Guard.NamesPerDomain, rule: cfg.Guard.NamesPerRule}
	s.cache = newCache(cfg.CacheSize)
	s.pools = map[string]*udpPool{}
	for _, u := range cfg.Upstreams {
		s.pools[u] = newUDPPool(u)
	}
	if s.metrics, err = newMetrics(cfg.Registry, s.cache.len); err != nil {
		return nil, err
	}
	if err := s.listen(cfg.Addr); err != nil {
		return nil, err
	}
	s.tcpSrv = &dns.Server{Listener: s.tcp, Handler: s}
	return s, nil
}

// listen binds UDP then TCP on the same port (retrying a few times when port 0 picks a
// UDP port whose TCP twin is taken).
func (s *Server) listen(addr string) error {
	var errs []error
	for range 10 {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("dnsfilter: listen udp %s: %w", addr, err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			s.udp, s.tcp = pc, l
			return nil
		}
		pc.Close()
		errs = append(errs, err)
		if _, port, _ := net.SplitHostPort(addr); port != "0" {
			break
		}
	}
	return fmt.Errorf("dnsfilter: listen tcp: %w", errors.Join(errs...))
}

// Addr returns the bound address (the same port for UDP and TCP).
func (s *Server) Addr() netip.AddrPort {
	return s.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Run serves until ctx ends or Close is called; it then shuts the listeners down and
// returns nil (or the first serving error).
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	// Counted here, not in the goroutine: Close waits for inflight, and an Add that
	// could run concurrently with that Wait from a zero count is a race (a filter
	// closed right after it started).
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		errc <- s.serveUDP()
	}()
	go func() { errc <- s.tcpSrv.ActivateAndServe() }()
	var err error
	select {
	case <-ctx.Done():
	case <-s.done:
	case err = <-errc:
	}
	s.Close()
	return err
}

// Close stops serving. It is safe to call more than once and before Run.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		_ = s.tcpSrv.Shutdown()
		// closing the sockets also stops a server that had not started yet
		s.udp.Close()
		s.tcp.Close()
		s.inflight.Wait() // the UDP readers and the queries in flight
		for _, p := range s.pools {
			p.close()
		}
	})
	return nil
}

// closing reports whether Close has been called.
func (s *Server) closing() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *Server) audit(d *policies.Decider, r audit.Record, dec policies.Decision) {
	if s.cfg.Audit == nil || (d != nil && !d.ShouldAudit(dec)) {
		return
	}
	s.cfg.Audit.Append(r)
}
