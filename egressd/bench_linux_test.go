package egressd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/sdk"
)

const benchSuite = "egressd"

// TestBenchDNSLearning measures the DNS answer latency of an allowed, uncached name
// through the DNS filter with egressd's learning hook programming the eBPF datapath of
// an attached sandbox (a veth of a test namespace), against the same filter with no
// hook. Queries alternate between the two filters so that both see the same machine.
func TestBenchDNSLearning(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	dp, err := enforcer.New(enforcer.Config{Mode: enforcer.ModeEBPF, NetNS: tp.Host.Path(), EBPF: EBPFBackend(pinRoot(t))})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	const id = "sbx-bench-dns"
	dec, err := policies.Load(id, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.bench.test"}]}`), policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil {
		t.Fatal(err)
	}
	c := compile(dec, compileOptions{})
	if err := dp.Attach(datapath.Spec{ID: id, HostIfindex: tp.HostIfindex, HostIfname: tp.HostIfname,
		Addrs: []netip.Addr{dt.Sandbox4}, Resolvers: []netip.Addr{dt.Gateway4}, Policy: c.policy}); err != nil {
		t.Fatal(err)
	}
	defer dp.Detach(id)
	m, _ := newMetrics(nil)
	d := &Daemon{dp: dp, metrics: m, byID: map[string]*sandbox{id: {view: watch.Sandbox{ID: id}, c: c, attached: true, learned: map[netip.Addr]learnedAddr{}}}}

	up := benchUpstream(t)
	lookup := func(netip.Addr) (dnsfilter.Sandbox, bool) { return dnsfilter.Sandbox{ID: id, Policy: dec}, true }
	start := func(learn dnsfilter.Learner) string {
		// 3,000 new names from one sandbox: the tunnelling guard's caps out of reach
		guard := dnsfilter.GuardConfig{NamesPerSandbox: 1 << 30, NamesPerDomain: 1 << 30, NamesPerRule: 1 << 30}
		s, err := dnsfilter.New(dnsfilter.Config{Addr: "127.0.0.1:0", Upstreams: []string{up}, Lookup: lookup, Learn: learn, CacheSize: -1, Guard: guard})
		if err != nil {
			t.Fatal(err)
		}
		go s.Run(context.Background())
		t.Cleanup(func() { s.Close() })
		return s.Addr().String()
	}
	withLearn, alone := start(d.learn), start(nil)
	client := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	ask := func(addr string, i int) error {
		q := new(dns.Msg)
		q.SetQuestion(fmt.Sprintf("n%d.bench.test.", i), dns.TypeA)
		r, _, err := client.Exchange(q, addr)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			return fmt.Errorf("answer %v", r)
		}
		return nil
	}
	const n = 3000
	var a, b benchreport.Sample
	a.Name, b.Name = "dns_uncached_with_learning", "dns_uncached_filter_alone"
	for i := range n {
		for _, x := range []struct {
			s    *benchreport.Sample
			addr string
		}{{&a, withLearn}, {&b, alone}} {
			t0 := time.Now()
			if err := ask(x.addr, i); err != nil {
				t.Fatal(err)
			}
			x.s.Latencies = append(x.s.Latencies, time.Since(t0))
			x.s.Wall += time.Since(t0)
		}
	}
	benchreport.Print(benchSuite, a)
	benchreport.Print(benchSuite, b)
	st, _ := dp.Stats()
	if got := st.Sandboxes[id].Learned; got < n/2 {
		t.Errorf("only %d addresses learned", got)
	}
	benchreport.Ratio(benchSuite, "dns p50 with learning / filter alone", float64(a.Quantile(0.5))/float64(b.Quantile(0.5)), "≤", 0)
	benchreport.Ratio(benchSuite, "dns p99 with learning / filter alone", float64(a.Quantile(0.99))/float64(b.Quantile(0.99)), "≤", 0)
}

// benchUpstream answers every A query with a distinct public-looking address (never
// dialled: it is only learned).
func benchUpstream(t *testing.T) string {
	return dnstest.Serve(t, func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		var i int
		fmt.Sscanf(strings.TrimPrefix(q.Question[0].Name, "n"), "%d", &i)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A: net.IPv4(44, byte(i>>16), byte(i>>8), byte(i))}}
		w.WriteMsg(m)
	})
}

// TestBenchPolicyPropagation measures, on a real sandbox, the time from a policy PUT on
// lifecycle's API to the new version enforced by egressd's datapath (target ≤ 100 ms).
func TestBenchPolicyPropagation(t *testing.T) {
	testenv.NeedBench(t)
	w := newWorld(t)
	d, _ := w.daemon(t, enforcer.ModeEBPF, pinRoot(t))
	sb, _ := w.create(t, d, startPolicy)
	s := benchreport.Sample{Name: "policy_put_to_enforced"}
	for i := range 50 {
		doc := startPolicy
		if i%2 == 0 {
			doc = changedPolicy
		}
		t0 := time.Now()
		req, _ := http.NewRequest(http.MethodPut, w.h.HTTP.URL+"/v1/sandboxes/"+sb.ID+"/policy", strings.NewReader(doc))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := uint64(i + 2)
		for {
			d.mu.RLock()
			e := d.byID[sb.ID]
			done := e != nil && e.attached && e.view.PolicyVersion == want
			d.mu.RUnlock()
			if done {
				break
			}
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("version %d not enforced after 10 s", want)
			}
			time.Sleep(100 * time.Microsecond)
		}
		s.Latencies = append(s.Latencies, time.Since(t0))
		s.Wall += time.Since(t0)
	}
	benchreport.Print(benchSuite, s)
	benchreport.Ratio(benchSuite, "policy put to enforced p99 ms", float64(s.Quantile(0.99))/float64(time.Millisecond), "≤", 100)
}

// TestBenchPooledCreate measures create→ready (the create answered, then the first
// execd /ping through the endpoint it gives) of sandboxes with a policy, claimed from a
// warm pool next to cold ones, interleaved, egressd (eBPF) enforcing. A claim answers
// only once the policy is enforced, so the figure includes enforcement.
func TestBenchPooledCreate(t *testing.T) {
	testenv.NeedBench(t)
	img := testenv.NeedSandboxImage(t)
	const size, n = 4, 30
	pooled := map[string]string{"cpu": "500m", "memory": "256Mi"}
	w := newWorld(t, func(o *lctest.Options) {
		o.Pools = []lifecycle.PoolSpec{{Image: img, Size: size, ResourceLimits: pooled}}
	})
	w.daemon(t, enforcer.ModeEBPF, pinRoot(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	waitFull := func() {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if p := w.h.Server.Pools()[0]; p.Ready == size && p.Warming == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool not refilled: %+v", w.h.Server.Pools())
			}
		}
	}
	ready := func(res map[string]string) (time.Duration, string) {
		t0 := time.Now()
		sb, err := w.api.Create(ctx, sdk.CreateRequest{Image: img, Resources: res, Timeout: 10 * time.Minute,
			NetworkPolicy: json.RawMessage(startPolicy)})
		if err != nil {
			t.Fatal(err)
		}
		x, err := w.api.Execd(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0), sb.ID
	}
	warm := benchreport.Sample{Name: "create_to_ready_pooled_with_policy"}
	cold := benchreport.Sample{Name: "create_to_ready_cold_with_policy"}
	for range n {
		waitFull()
		d, id := ready(pooled)
		warm.Latencies = append(warm.Latencies, d)
		warm.Wall += d
		_ = w.api.Kill(ctx, id)
		d, id = ready(map[string]string{"cpu": "250m", "memory": "256Mi"}) // matches no pool
		cold.Latencies = append(cold.Latencies, d)
		cold.Wall += d
		_ = w.api.Kill(ctx, id)
	}
	benchreport.Print(benchSuite, warm)
	benchreport.Print(benchSuite, cold)
	benchreport.Ratio(benchSuite, "pooled create to ready p50 ms", float64(warm.Quantile(0.5))/float64(time.Millisecond), "≤", 50)
	benchreport.Ratio(benchSuite, "pooled create to ready p99 ms", float64(warm.Quantile(0.99))/float64(time.Millisecond), "≤", 0)
	benchreport.Ratio(benchSuite, "create_to_ready_p50_pooled_vs_cold", float64(warm.Quantile(0.5))/float64(cold.Quantile(0.5)), "≤", 0)
}
