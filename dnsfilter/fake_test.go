package dnsfilter

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// fakeUpstream is a resolver on loopback that the tests start: a fixed zone, a count of
// the queries it saw per name/type/transport, and hooks to hold answers.
type fakeUpstream struct {
	addr   string
	mu     sync.Mutex
	counts map[string]int
	hold   chan struct{} // "slow." answers wait for it
	held   atomic.Int32
	udp    *dns.Server
	tcp    *dns.Server
}

func startUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	var pc net.PacketConn
	var l net.Listener
	for i := 0; l == nil; i++ { // the UDP port's TCP twin may be taken: try another
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if l, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close()
			if i == 10 {
				t.Fatal(err)
			}
		}
	}
	u := &fakeUpstream{addr: pc.LocalAddr().String(), counts: map[string]int{}, hold: make(chan struct{})}
	u.udp = &dns.Server{PacketConn: pc, Handler: u}
	u.tcp = &dns.Server{Listener: l, Handler: u}
	for _, s := range []*dns.Server{u.udp, u.tcp} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
	}
	t.Cleanup(func() { u.udp.Shutdown(); u.tcp.Shutdown() })
	return u
}

func (u *fakeUpstream) count(name string, qtype uint16, proto string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[fmt.Sprintf("%s/%s/%s", dns.Fqdn(name), dns.TypeToString[qtype], proto)]
}

func (u *fakeUpstream) total(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for k, v := range u.counts {
		if strings.HasPrefix(k, dns.Fqdn(name)+"/") {
			n += v
		}
	}
	return n
}

func rr(s string) dns.RR {
	r, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return r
}

// zone answers by name. Names under bench. answer A 198.51.100.1 (the benchmarks).
func (u *fakeUpstream) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	proto := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		proto = "tcp"
	}
	name := strings.ToLower(q.Name)
	if !strings.HasSuffix(name, ".bench.") {
		u.mu.Lock()
		u.counts[fmt.Sprintf("%s/%s/%s", name, dns.TypeToString[q.Qtype], proto)]++
		u.mu.Unlock()
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	a := func(ttl int, ips ...string) {
		for _, ip := range ips {
			m.Answer = append(m.Answer, rr(fmt.Sprintf("%s %d IN A %s", q.Name, ttl, ip)))
		}
	}
	switch {
	case strings.HasSuffix(name, ".rtt.bench."):
		time.Sleep(time.Millisecond) // a resolver one LAN round trip away
		a(300, "198.51.100.1")
	case strings.HasSuffix(name, ".bench."):
		a(300, "198.51.100.1")
	case q.Qtype == dns.TypeTXT:
		m.Answer = append(m.Answer, rr(q.Name+" 300 IN TXT \"data\""))
	case name == "allowed.example.com.":
		a(300, "198.51.100.10")
	case name == "short.example.com.":
		a(5, "198.51.100.11")
	case name == "long.example.com.":
		a(86400, "198.51.100.12")
	case name == "alias.example.com.":
		m.Answer = append(m.Answer, rr(q.Name+" 300 IN CNAME edge.cdn.example.net."),
			rr("edge.cdn.example.net. 120 IN A 198.51.100.20"),
			rr("unrelated.example.net. 120 IN A 198.51.100.99"))
	case name == "evilalias.example.com.":
		m.Answer = append(m.Answer, rr(q.Name+" 300 IN CNAME c2.blocked.example.org."),
			rr("c2.blocked.example.org. 300 IN A 198.51.100.66"))
	case name == "rebind.example.com.":
		a(60, "127.0.0.1", "10.0.0.8", "198.51.100.13")
	case name == "big.example.com.":
		if proto == "udp" {
			m.Truncated = true
			break
		}
		for i := range 100 {
			a(300, fmt.Sprintf("198.51.100.%d", i+1))
		}
	case name == "slow.example.com.":
		u.held.Add(1)
		<-u.hold
		a(300, "198.51.100.30")
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, rr("example.com. 3600 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 60"))
	}
	w.WriteMsg(m)
}

// recorder collects audit records and learned events.
type recorder struct {
	mu      sync.Mutex
	records []audit.Record
	learned []Learned
}

func (r *recorder) Append(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec)
}

func (r *recorder) all() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.records...)
}

func (r *recorder) learns() []Learned {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Learned(nil), r.learned...)
}

// harness is a running filter for the sandbox at 127.0.0.1, its upstream and recorder.
type harness struct {
	srv    *Server
	up     *fakeUpstream
	rec    *recorder
	policy atomic.Pointer[policies.Decider]
	reg    *prometheus.Registry
}

const testPolicy = `
egress:
  - {action: allow, target: "*.example.com"}
  - {action: allow, target: "*.cdn.example.net"}
  - {action: allow, target: "*.bench"}
  - {action: deny, target: "*.example.org"}
`

func startFilter(t testing.TB, policy string, tweak func(*Config)) *harness {
	t.Helper()
	h := &harness{up: startUpstream(t), rec: &recorder{}, reg: prometheus.NewRegistry()}
	h.setPolicy(t, policy)
	cfg := Config{
		Addr:      "127.0.0.1:0",
		Upstreams: []string{h.up.addr},
		Lookup: func(src netip.Addr) (Sandbox, bool) {
			if src != netip.MustParseAddr("127.0.0.1") {
				return Sandbox{}, false
			}
			return Sandbox{ID: "sb-test", Policy: h.policy.Load()}, true
		},
		Learn: func(ctx context.Context, l Learned) error {
			h.rec.mu.Lock()
			defer h.rec.mu.Unlock()
			h.rec.learned = append(h.rec.learned, l)
			return nil
		},
		Audit:    h.rec,
		Registry: h.reg,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func (h *harness) setPolicy(t testing.TB, doc string) {
	t.Helper()
	d, err := policies.Load("test-policy", []byte(doc), policies.CompileOptions{Overlay: policies.BaseOverlay(), Version: 5})
	if err != nil {
		t.Fatal(err)
	}
	h.policy.Store(d)
}

// ask sends one query for name/qtype over net ("udp" or "tcp") with EDNS (bufsize 0:
// none) and returns the answer.
func (h *harness) ask(t testing.TB, netw, name string, qtype uint16, bufsize uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if bufsize > 0 {
		m.SetEdns0(bufsize, false)
	}
	c := &dns.Client{Net: netw, Timeout: 10 * time.Second, UDPSize: bufsize}
	r, _, err := c.Exchange(m, h.srv.Addr().String())
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], netw, err)
	}
	return r
}
