package dnsfilter

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// connPool hands each benchmark worker its own UDP connection to one server, so the
// client side costs the same in every measurement.
type connPool struct {
	addr string
	pool sync.Pool
}

func (p *connPool) exchange(name string) error {
	c, _ := p.pool.Get().(*dns.Conn)
	if c == nil {
		var err error
		if c, err = dns.Dial("udp", p.addr); err != nil {
			return err
		}
	}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteMsg(m); err != nil {
		c.Close()
		return err
	}
	for {
		r, err := c.ReadMsg()
		if err != nil {
			c.Close()
			return err
		}
		if r.Id != m.Id {
			continue // a late answer to an earlier, timed-out query
		}
		p.pool.Put(c)
		if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
			return fmt.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
		}
		return nil
	}
}

// startRelay starts a bare UDP relay to upstream on loopback: workers that each pass a
// query to the upstream on their own socket and its answer back, parsing nothing. No
// forwarder can do less per query, so its rate is the ceiling for a cold cache.
func startRelay(t *testing.T, upstream string, workers int) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	for range workers {
		up, err := net.Dial("udp", upstream)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { up.Close() })
		go func() {
			buf := make([]byte, dns.DefaultMsgSize)
			for {
				n, from, err := pc.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				if _, err := up.Write(buf[:n]); err != nil {
					return
				}
				if n, err = up.Read(buf); err != nil {
					return
				}
				pc.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
	}
	return pc.LocalAddr().String()
}

// TestBenchDNSFilter measures queries/s and p99 on loopback, side by side: (a) the fake
// upstream directly, (b) through the filter with a cold cache (every name new), (c)
// through the filter with a warm cache, (d) denied names, (e) a bare UDP relay to the
// same upstream (the ceiling for any forwarder with a cold cache: a second hop on
// loopback costs about as much as the first). The filter runs as egressd
// runs it: learning hook and a real audit writer (fsync batching on) with the OCSF
// export on, as every server has it by default (stack.OpenAudit), so the ratios hold
// with export on. Everything shares
// one process and the machine's cores, so (b), which adds a second DNS hop, is bounded
// by CPU; a supplementary pair repeats (a)/(b) with an upstream 1 ms away.
func TestBenchDNSFilter(t *testing.T) {
	testenv.NeedBench(t)
	dir := t.TempDir()
	ex, err := ocsf.New(ocsf.Config{ChainDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	aw, err := audit.New(audit.Config{Dir: dir, QueueSize: 1 << 18, Sink: ex})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	var learned atomic.Int64
	h := startFilter(t, testPolicy, func(c *Config) {
		c.Audit = aw
		c.CacheSize = 1 << 20
		c.Learn = func(context.Context, Learned) error { learned.Add(1); return nil }
		// The cold scenarios ask tens of thousands of new names a minute from one
		// sandbox: caps so high that the guard counts every name (its cost is measured)
		// and never refuses one.
		c.Guard = GuardConfig{NamesPerSandbox: 1 << 30, NamesPerDomain: 1 << 30, NamesPerRule: 1 << 30}
	})
	direct := &connPool{addr: h.up.addr}
	filter := &connPool{addr: h.srv.Addr().String()}
	relay := &connPool{addr: startRelay(t, h.up.addr, 16)}
	const n, workers, rounds = 30000, 8, 5
	var cold, coldDirect atomic.Int64
	warmNames := make([]string, 64)
	for i := range warmNames {
		warmNames[i] = fmt.Sprintf("w%d.bench.", i)
		if err := filter.exchange(warmNames[i]); err != nil {
			t.Fatal(err)
		}
	}
	var warmI, denyI atomic.Int64
	scenarios := []struct {
		name string
		op   func() error
	}{
		{"a-upstream-direct", func() error { return direct.exchange(fmt.Sprintf("d%d.bench.", coldDirect.Add(1))) }},
		{"b-filter-allowed-cold", func() error { return filter.exchange(fmt.Sprintf("c%d.bench.", cold.Add(1))) }},
		{"c-filter-allowed-warm", func() error { return filter.exchange(warmNames[warmI.Add(1)%int64(len(warmNames))]) }},
		{"d-filter-denied", func() error { return filter.exchange(fmt.Sprintf("x%d.example.org.", denyI.Add(1)%1000)) }},
		{"e-bare-relay", func() error { return relay.exchange(fmt.Sprintf("r%d.bench.", coldDirect.Add(1))) }},
		// supplementary: an upstream 1 ms away, as a real resolver is
		{"a1ms-upstream-direct", func() error { return direct.exchange(fmt.Sprintf("d%d.rtt.bench.", coldDirect.Add(1))) }},
		{"b1ms-filter-allowed-cold", func() error { return filter.exchange(fmt.Sprintf("c%d.rtt.bench.", cold.Add(1))) }},
	}
	// Rounds interleave the scenarios so that load from elsewhere on the machine hits
	// them alike; each scenario's samples are pooled over the rounds.
	samples := make([]benchreport.Sample, len(scenarios))
	for round := range rounds {
		for i, sc := range scenarios {
			if round == 0 { // warm the connections
				if _, err := benchreport.MeasureParallel(sc.name, workers, 500, sc.op); err != nil {
					t.Fatal(err)
				}
			}
			s, err := benchreport.MeasureParallel(sc.name, workers, n/rounds, sc.op)
			if err != nil {
				t.Fatal(err)
			}
			samples[i].Name = sc.name
			samples[i].Latencies = append(samples[i].Latencies, s.Latencies...)
			samples[i].Wall += s.Wall
		}
	}
	for _, s := range samples {
		benchreport.Print("dnsfilter", s)
	}
	a, b, c, d, e := samples[0], samples[1], samples[2], samples[3], samples[4]
	benchreport.Ratio("dnsfilter", "queries/s (c) warm cache / (a) direct upstream (audit with OCSF export on)", c.Rate()/a.Rate(), "≥", 1.0)
	benchreport.Ratio("dnsfilter", "queries/s (b) cold cache / (a) direct upstream (audit with OCSF export on)", b.Rate()/a.Rate(), "≥", 0.8)
	benchreport.Ratio("dnsfilter", "queries/s (d) denied / (a) direct upstream", d.Rate()/a.Rate(), "", 0)
	benchreport.Ratio("dnsfilter", "queries/s (e) bare relay / (a) direct upstream: the most any forwarder's cold cache can reach here", e.Rate()/a.Rate(), "", 0)
	benchreport.Ratio("dnsfilter", "queries/s (b) cold cache / (e) bare relay", b.Rate()/e.Rate(), "", 0)
	benchreport.Ratio("dnsfilter", "p99 (b) cold / (a) direct", float64(b.Quantile(0.99))/float64(a.Quantile(0.99)), "", 0)
	benchreport.Ratio("dnsfilter", "queries/s cold / direct with a 1 ms upstream (supplementary)", samples[6].Rate()/samples[5].Rate(), "", 0)
	if learned.Load() == 0 {
		t.Error("the learning hook never ran")
	}
}
