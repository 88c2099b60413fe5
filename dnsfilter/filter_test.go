package dnsfilter

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/airlockdev/airlock/audit"
)

func addrs(m *dns.Msg) []string {
	var out []string
	for _, r := range m.Answer {
		switch v := r.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		}
	}
	return out
}

func findRecord(t *testing.T, recs []audit.Record, pred func(audit.Record) bool) audit.Record {
	t.Helper()
	for _, r := range recs {
		if pred(r) {
			return r
		}
	}
	t.Fatalf("no matching audit record in %+v", recs)
	return audit.Record{}
}

func TestAllowedNameIsForwardedLearnedAndAudited(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	r := h.ask(t, "udp", "Allowed.Example.com", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || !slices.Equal(addrs(r), []string{"198.51.100.10"}) {
		t.Fatalf("answer = %v", r)
	}
	if r.Question[0].Name != "Allowed.Example.com." {
		t.Errorf("question case not preserved: %s", r.Question[0].Name)
	}
	l := h.rec.learns()
	if len(l) != 1 || l[0].SandboxID != "sb-test" || l[0].Name != "allowed.example.com" ||
		l[0].TTL != 300*time.Second || len(l[0].Addrs) != 1 || !l[0].Ports.All() {
		t.Fatalf("learned = %+v", l)
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "allowed.example.com" })
	if rec.Action != "allow" || rec.SandboxID != "sb-test" || rec.Source != audit.SourceDNS || rec.Proto != "udp" ||
		rec.QType != "A" || rec.Rule != "egress[0]" || rec.PolicyVersion != 5 || rec.Mode != "enforce" {
		t.Errorf("audit record = %+v", rec)
	}
	if got := testutil.ToFloat64(h.srv.metrics.queries.WithLabelValues("allow")); got != 1 {
		t.Errorf("queries_total{result=allow} = %v", got)
	}
}

func TestDeniedNameNeverReachesUpstream(t *testing.T) {
	for _, c := range []struct {
		name  string
		rcode int
	}{{"nxdomain", 0}, {"refused", dns.RcodeRefused}} {
		t.Run(c.name, func(t *testing.T) {
			h := startFilter(t, testPolicy, func(cfg *Config) { cfg.DenyRcode = c.rcode })
			want := dns.RcodeNameError
			if c.rcode != 0 {
				want = c.rcode
			}
			for _, name := range []string{"www.example.org", "example.net", "metadata.google.internal"} {
				r := h.ask(t, "udp", name, dns.TypeA, 1232)
				if r.Rcode != want || len(r.Answer) != 0 {
					t.Errorf("%s: rcode %s, %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
				}
				if ede := findEDE(r); ede == nil || ede.InfoCode != dns.ExtendedErrorCodeBlocked {
					t.Errorf("%s: no Blocked EDE: %v", name, r.Extra)
				}
				if n := h.up.total(name); n != 0 {
					t.Errorf("%s: upstream saw %d queries", name, n)
				}
			}
			rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "www.example.org" })
			if rec.Action != "deny" || rec.Rule != "egress[3]" {
				t.Errorf("audit = %+v", rec)
			}
			rec = findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "metadata.google.internal" })
			if !strings.HasPrefix(rec.Rule, "overlay.alwaysDeny") {
				t.Errorf("metadata audit rule = %s", rec.Rule)
			}
			if len(h.rec.learns()) != 0 {
				t.Error("a denied name was learned")
			}
		})
	}
}

func findEDE(m *dns.Msg) *dns.EDNS0_EDE {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e
			}
		}
	}
	return nil
}

func TestQueryTypeDenied(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	for _, qt := range []uint16{dns.TypeTXT, dns.TypeANY, dns.TypeNULL} {
		r := h.ask(t, "udp", "allowed.example.com", qt, 0)
		if r.Rcode != dns.RcodeNotImplemented {
			t.Errorf("%s: rcode %s", dns.TypeToString[qt], dns.RcodeToString[r.Rcode])
		}
		if n := h.up.count("allowed.example.com", qt, "udp"); n != 0 {
			t.Errorf("%s reached the upstream", dns.TypeToString[qt])
		}
	}
	h2 := startFilter(t, testPolicy, func(c *Config) { c.QTypeRcode = dns.RcodeRefused })
	if r := h2.ask(t, "udp", "allowed.example.com", dns.TypeTXT, 0); r.Rcode != dns.RcodeRefused {
		t.Errorf("REFUSED configured, got %s", dns.RcodeToString[r.Rcode])
	}
	h3 := startFilter(t, testPolicy+"dns:\n  queryTypes: [A, TXT]\n", nil)
	if r := h3.ask(t, "udp", "allowed.example.com", dns.TypeTXT, 0); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("TXT allowed by the policy: %v", r)
	}
}

func TestTTLClamp(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	short := h.ask(t, "udp", "short.example.com", dns.TypeA, 0)
	long := h.ask(t, "udp", "long.example.com", dns.TypeA, 0)
	if ttl := short.Answer[0].Header().Ttl; ttl != 5 {
		t.Errorf("short answer TTL %d, want 5 (never raised for the client)", ttl)
	}
	if ttl := long.Answer[0].Header().Ttl; ttl != 600 {
		t.Errorf("long answer TTL %d, want 600 (capped at MaxTTL)", ttl)
	}
	l := h.rec.learns()
	if len(l) != 2 || l[0].TTL != 30*time.Second || l[1].TTL != 600*time.Second {
		t.Fatalf("learned TTLs = %+v", l)
	}
	h2 := startFilter(t, testPolicy, func(c *Config) { c.MinTTL, c.MaxTTL = 10*time.Second, 100*time.Second })
	h2.ask(t, "udp", "short.example.com", dns.TypeA, 0)
	if l := h2.rec.learns(); l[0].TTL != 10*time.Second {
		t.Errorf("configured MinTTL: learned %s", l[0].TTL)
	}
}

func TestCacheHitAsksUpstreamOnce(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	for range 5 {
		if r := h.ask(t, "udp", "allowed.example.com", dns.TypeA, 0); len(r.Answer) != 1 {
			t.Fatalf("answer = %v", r)
		}
	}
	if n := h.up.total("allowed.example.com"); n != 1 {
		t.Errorf("upstream saw %d queries, want 1", n)
	}
	if l := h.rec.learns(); len(l) != 5 {
		t.Errorf("cache hits must be learned too (entries may have expired): %d", len(l))
	}
	recs := h.rec.all()
	if recs[0].Extra["cached"] != nil || recs[4].Extra["cached"] != true {
		t.Errorf("cached flags: %v %v", recs[0].Extra, recs[4].Extra)
	}
	// negative answers are cached for the SOA's negative TTL
	h.ask(t, "udp", "nothing.example.com", dns.TypeA, 0)
	if r := h.ask(t, "udp", "nothing.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Errorf("negative answer = %s", dns.RcodeToString[r.Rcode])
	}
	if n := h.up.total("nothing.example.com"); n != 1 {
		t.Errorf("negative answer asked upstream %d times", n)
	}
}

func TestSingleflight(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	const clients = 20
	var wg sync.WaitGroup
	answers := make(chan *dns.Msg, clients)
	for range clients {
		wg.Go(func() { answers <- h.ask(t, "udp", "slow.example.com", dns.TypeA, 0) })
	}
	// release the upstream once every client's query has missed the cache and joined
	misses := h.srv.metrics.cache.WithLabelValues("miss")
	for testutil.ToFloat64(misses) < clients || h.up.held.Load() < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the last miss to reach the flight group
	close(h.up.hold)
	wg.Wait()
	close(answers)
	for r := range answers {
		if !slices.Equal(addrs(r), []string{"198.51.100.30"}) {
			t.Fatalf("answer = %v", r)
		}
	}
	if n := h.up.total("slow.example.com"); n != 1 {
		t.Errorf("upstream saw %d queries for %d concurrent clients, want 1", n, clients)
	}
}

func TestTruncationFallsBackToTCP(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	udp := h.ask(t, "udp", "big.example.com", dns.TypeA, 1232)
	if h.up.count("big.example.com", dns.TypeA, "tcp") != 1 {
		t.Fatalf("filter did not retry the truncated upstream answer over TCP")
	}
	if !udp.Truncated {
		t.Errorf("a 100-record answer fits in 1232 bytes? truncated=%t answers=%d", udp.Truncated, len(udp.Answer))
	}
	tcp := h.ask(t, "tcp", "big.example.com", dns.TypeA, 1232)
	if tcp.Truncated || len(addrs(tcp)) != 100 {
		t.Errorf("TCP answer: truncated=%t, %d addresses", tcp.Truncated, len(addrs(tcp)))
	}
	if rec := h.rec.all()[1]; rec.Proto != "tcp" {
		t.Errorf("TCP query audited as %q", rec.Proto)
	}
}

func TestCNAMEChainCheckedHopByHop(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	r := h.ask(t, "udp", "alias.example.com", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || !slices.Equal(addrs(r), []string{"198.51.100.20"}) || len(r.Answer) != 2 {
		t.Fatalf("alias answer = %v (the unrelated record must be dropped)", r)
	}
	l := h.rec.learns()
	if len(l) != 1 || !slices.Equal(l[0].Chain, []string{"alias.example.com", "edge.cdn.example.net"}) || l[0].TTL != 120*time.Second {
		t.Fatalf("learned = %+v", l)
	}
	r = h.ask(t, "udp", "evilalias.example.com", dns.TypeA, 0)
	if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Fatalf("CNAME to a denied name answered %s with %d records", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "evilalias.example.com" })
	if rec.Action != "deny" || rec.Rule != "egress[3]" || !strings.Contains(rec.Reason, "CNAME to c2.blocked.example.org") {
		t.Errorf("audit = %+v", rec)
	}
	if len(h.rec.learns()) != 1 {
		t.Error("the denied chain was learned")
	}
}

func TestRebindingAnswerDropped(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	r := h.ask(t, "udp", "rebind.example.com", dns.TypeA, 0)
	if !slices.Equal(addrs(r), []string{"198.51.100.13"}) {
		t.Fatalf("answer = %v, want only the public address", addrs(r))
	}
	l := h.rec.learns()
	if len(l) != 1 || len(l[0].Addrs) != 1 || l[0].Addrs[0] != netip.MustParseAddr("198.51.100.13") {
		t.Fatalf("learned = %+v", l)
	}
	recs := h.rec.all()
	lo := findRecord(t, recs, func(r audit.Record) bool { return r.DstIP == "127.0.0.1" })
	ten := findRecord(t, recs, func(r audit.Record) bool { return r.DstIP == "10.0.0.8" })
	if lo.Action != "deny" || !strings.HasPrefix(lo.Rule, "overlay.alwaysDeny") || ten.Action != "deny" || ten.Rule != "guard" ||
		!strings.Contains(ten.Reason, "private") {
		t.Errorf("rebinding audit: %+v / %+v", lo, ten)
	}
	// an explicit CIDR rule lets the private address through
	h.setPolicy(t, testPolicy+"  - {action: allow, target: 10.0.0.0/24}\n")
	if r := h.ask(t, "udp", "rebind.example.com", dns.TypeA, 0); !slices.Equal(addrs(r), []string{"10.0.0.8", "198.51.100.13"}) {
		t.Errorf("with an explicit rule: %v", addrs(r))
	}
}

func TestLearningHookReturnsBeforeAnswer(t *testing.T) {
	var returned atomic.Bool
	h := startFilter(t, testPolicy, func(c *Config) {
		c.Learn = func(ctx context.Context, l Learned) error {
			time.Sleep(100 * time.Millisecond) // programming a map takes time; the answer must wait
			returned.Store(true)
			return nil
		}
	})
	r := h.ask(t, "udp", "allowed.example.com", dns.TypeA, 0)
	if !returned.Load() {
		t.Fatal("the client received the answer before the learning hook returned")
	}
	if len(r.Answer) != 1 {
		t.Fatalf("answer = %v", r)
	}
	h2 := startFilter(t, testPolicy, func(c *Config) {
		c.Learn = func(context.Context, Learned) error { return errors.New("map full") }
	})
	if r := h2.ask(t, "udp", "allowed.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Errorf("hook failure answered %s with %d records", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
}

func TestUnknownSourceRefused(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	m := new(dns.Msg)
	m.SetQuestion("allowed.example.com.", dns.TypeA)
	c := &dns.Client{Net: "udp", Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP("127.0.0.2")}}}
	r, _, err := c.Exchange(m, h.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeRefused || h.up.total("allowed.example.com") != 0 {
		t.Errorf("unknown source: %s, upstream %d", dns.RcodeToString[r.Rcode], h.up.total("allowed.example.com"))
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.Src != "" })
	if rec.Action != "deny" || rec.SandboxID != "" || !strings.HasPrefix(rec.Src, "127.0.0.2:") {
		t.Errorf("audit = %+v", rec)
	}
}

func TestPolicyChangeAppliesToNextQuery(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	if r := h.ask(t, "udp", "allowed.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeSuccess {
		t.Fatal(r)
	}
	h.setPolicy(t, "egress:\n  - {action: deny, target: allowed.example.com}\n")
	if r := h.ask(t, "udp", "allowed.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Errorf("after the change: %s (the cached answer must not bypass the new policy)", dns.RcodeToString[r.Rcode])
	}
}

func TestReportModeAnswersAndAuditsWouldDeny(t *testing.T) {
	h := startFilter(t, "mode: report\negress:\n  - {action: allow, target: allowed.example.com}\n", nil)
	r := h.ask(t, "udp", "short.example.com", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("report mode denied: %v", r)
	}
	if r := h.ask(t, "udp", "short.example.com", dns.TypeTXT, 0); r.Rcode != dns.RcodeSuccess {
		t.Errorf("report mode qtype: %s", dns.RcodeToString[r.Rcode])
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.QType == "A" })
	if rec.Action != "allow" || !rec.WouldDeny || rec.Mode != "audit" || rec.Rule != "default" {
		t.Errorf("audit = %+v", rec)
	}
	// the rebinding guard holds in report mode
	if r := h.ask(t, "udp", "rebind.example.com", dns.TypeA, 0); !slices.Equal(addrs(r), []string{"198.51.100.13"}) {
		t.Errorf("report mode rebinding: %v", addrs(r))
	}
}

func TestTunnelGuard(t *testing.T) {
	h := startFilter(t, testPolicy+"dns:\n  tunnelGuard:\n    maxQueriesPerMinute: 3\n", nil)
	r := h.ask(t, "udp", "mzxw6ytboi2dqnzrgezdgnbvgy3tqojq.t.example.com", dns.TypeA, 0)
	if r.Rcode != dns.RcodeRefused {
		t.Errorf("high-entropy label: %s", dns.RcodeToString[r.Rcode])
	}
	for i, name := range []string{"a.x.example.com", "b.x.example.com", "c.x.example.com", "a.x.example.com", "d.x.example.com"} {
		r := h.ask(t, "udp", name, dns.TypeA, 0)
		wantRefused := i == 4
		if (r.Rcode == dns.RcodeRefused) != wantRefused {
			t.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
		}
	}
	// the policy's maxQueriesPerMinute counts per registrable domain: another label
	// above example.com is the same domain
	if r := h.ask(t, "udp", "e.y.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeRefused {
		t.Errorf("e.y.example.com: %s", dns.RcodeToString[r.Rcode])
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "d.x.example.com" })
	if rec.Rule != "dns.tunnelGuard" || !strings.Contains(rec.Reason, "than 3 distinct names under example.com") {
		t.Errorf("audit = %+v", rec)
	}
}

func TestUpstreamFailover(t *testing.T) {
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close() // nothing listens: the attempt fails at once (ICMP port unreachable)
	h := startFilter(t, testPolicy, func(c *Config) {
		c.Upstreams = []string{deadAddr, c.Upstreams[0]}
		c.UpstreamTimeout = 500 * time.Millisecond
	})
	if r := h.ask(t, "udp", "allowed.example.com", dns.TypeA, 0); len(r.Answer) != 1 {
		t.Fatalf("failover answer = %v", r)
	}
	if got := testutil.ToFloat64(h.srv.metrics.upstreamErrors.WithLabelValues(deadAddr)); got != 1 {
		t.Errorf("upstream errors for the dead upstream = %v", got)
	}
}

func TestConfigErrors(t *testing.T) {
	lookup := func(netip.Addr) (Sandbox, bool) { return Sandbox{}, false }
	for _, cfg := range []Config{
		{Addr: "127.0.0.1:0", Upstreams: []string{"127.0.0.1:53"}},
		{Addr: "127.0.0.1:0", Lookup: lookup},
		{Addr: "127.0.0.1:0", Lookup: lookup, Upstreams: []string{"no-port"}},
		{Addr: "127.0.0.1:0", Lookup: lookup, Upstreams: []string{"127.0.0.1:53"}, DenyRcode: dns.RcodeServerFailure},
		{Addr: "127.0.0.1:0", Lookup: lookup, Upstreams: []string{"127.0.0.1:53"}, MinTTL: time.Hour, MaxTTL: time.Minute},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}

// TestResolveOnBehalfOfSandbox: Resolve takes the same path as a query the sandbox
// sends (policy, upstream, learning, audit), marked proto "proxy", and an unknown
// source is refused.
func TestResolveOnBehalfOfSandbox(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	sbx := netip.MustParseAddr("127.0.0.1")
	r, err := h.srv.Resolve(sbx, "allowed.example.com", dns.TypeA)
	if err != nil || r.Rcode != dns.RcodeSuccess || !slices.Equal(addrs(r), []string{"198.51.100.10"}) {
		t.Fatalf("Resolve(allowed) = %v, %v", r, err)
	}
	if l := h.rec.learns(); len(l) != 1 || l[0].Name != "allowed.example.com" {
		t.Errorf("learned = %+v", l)
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "allowed.example.com" })
	if rec.Proto != ProtoProxy || rec.Action != "allow" || rec.SandboxID != "sb-test" || rec.Src != "127.0.0.1:0" {
		t.Errorf("audit record = %+v", rec)
	}
	if r, err := h.srv.Resolve(sbx, "www.example.org", dns.TypeA); err != nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("Resolve(denied) = %v, %v", r, err)
	}
	if n := h.up.total("www.example.org"); n != 0 {
		t.Errorf("a denied name resolved for the proxy reached the upstream %d times", n)
	}
	if r, err := h.srv.Resolve(netip.MustParseAddr("127.0.0.2"), "allowed.example.com", dns.TypeA); err != nil || r.Rcode != dns.RcodeRefused {
		t.Errorf("Resolve(unknown source) = %v, %v", r, err)
	}
}
