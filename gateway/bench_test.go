package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// benchAudit is the audit log as a server has it (stack.OpenAudit): a real writer with
// the OCSF export on, counting what it is given.
type benchAudit struct {
	w *audit.Writer
	n atomic.Int64
}

func (b *benchAudit) Append(r audit.Record) { b.n.Add(1); b.w.Append(r) }

func newBenchAudit(t *testing.T) *benchAudit {
	dir := t.TempDir()
	ex, err := ocsf.New(ocsf.Config{ChainDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, Sink: ex})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return &benchAudit{w: w}
}

// benchClient returns a keep-alive client that sends every request to addr.
func benchClient(addr string, conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
	}, Timeout: 30 * time.Second}
}

func benchGet(c *http.Client, url, host string) func() error {
	return func() error {
		req, _ := http.NewRequest("GET", url, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

func merge(name string, ss ...benchreport.Sample) benchreport.Sample {
	out := benchreport.Sample{Name: name}
	for _, s := range ss {
		out.Latencies = append(out.Latencies, s.Latencies...)
		out.Wall += s.Wall
	}
	return out
}

// TestBenchGateway measures, side by side in one run, requests/s and p50/p99 of (a) the
// sandbox application directly, (b) Caddy's plain reverse_proxy to it, and (c) the Airlock
// gateway routing by host label among 10,000 routes (one real sandbox, the rest synthetic
// entries never contacted). Targets: (c)/(b) ≥ 0.95 in throughput, p99 within 10 %. It
// also measures route propagation: watch Put → first successful request.
func TestBenchGateway(t *testing.T) {
	testenv.NeedBench(t)
	up := sharedSandbox(t)
	const routes = 10_000
	sink := newBenchAudit(t) // audit with OCSF export on: the ratios hold with export on
	e := newEnvWith(t, func(c *Config) { c.Audit = sink }, func(cfg map[string]any) {
		// (b): a plain reverse_proxy server in the same Caddy instance.
		// Same server settings as the gateway's; only the handler differs.
		servers := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
		gwServer := servers["airlock"].(map[string]any)
		servers["plain"] = map[string]any{
			"listen":          []string{"127.0.0.1:" + benchPlainPort},
			"protocols":       gwServer["protocols"],
			"idle_timeout":    gwServer["idle_timeout"],
			"automatic_https": gwServer["automatic_https"],
			"routes": []any{map[string]any{"handle": []any{map[string]any{
				"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": net.JoinHostPort(up.addr.String(), itoa(up.port))}},
			}}}},
		}
		// (b) logs as Caddy ships: its reverse_proxy's logger gets the redacting encoder
		// without the gateway's airlock_lazy, so it encodes its With fields eagerly.
		logs := cfg["logging"].(map[string]any)["logs"].(map[string]any)
		def := logs["default"].(map[string]any)
		def["exclude"] = []string{"http.handlers.reverse_proxy"}
		logs["plain"] = map[string]any{"level": def["level"], "encoder": redactingEncoder(), "include": []string{"http.handlers.reverse_proxy"}}
	})

	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	for i := range routes - 1 {
		e.hub.Put(watch.Sandbox{ID: fmt.Sprintf("synthetic-%05d", i), State: "Running",
			Address: netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})})
	}
	e.hub.Put(runningSandbox("bench-real", up.addr))
	e.sync()
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	if n := e.gw.App().Table().Len(); n != routes {
		t.Fatalf("route table has %d routes, want %d", n, routes)
	}

	// Many short paired rounds: on 2 shared cores a burst of background load swings one
	// round by ±10 %; the median of 48 paired ratios holds still to about ±2 %, where
	// 16 swung by ±3 % from run to run around the gateway's true cost.
	const workers, n, rounds = 8, 2000, 48
	direct := benchClient(net.JoinHostPort(up.addr.String(), itoa(up.port)), workers)
	plain := benchClient("127.0.0.1:"+benchPlainPort, workers)
	gw := benchClient(e.gw.Addr(), workers)
	host := e.hostOf(itoa(up.port) + "-bench-real")
	ops := []struct {
		name string
		op   func() error
	}{
		{"direct", benchGet(direct, up.direct("/plain"), "")},
		{"caddy_reverse_proxy", benchGet(plain, "http://127.0.0.1:"+benchPlainPort+"/plain", "")},
		{"airlock_gateway_10k_routes", benchGet(gw, e.base()+"/plain", host)},
	}
	for _, o := range ops { // warm up connections and code paths
		if _, err := benchreport.MeasureParallel(o.name, workers, 1000, o.op); err != nil {
			t.Fatal(err)
		}
	}
	samples := make([][]benchreport.Sample, len(ops))
	// Bytes allocated and GC cycles while each side ran (the client's share included,
	// alike on every side): the gateway's own garbage is the difference.
	allocs, gcs := make([]uint64, len(ops)), make([]uint32, len(ops))
	// CPU time of this process (client, Caddy, gateway, audit writer and export; not the
	// sandbox's application) while each side ran.
	cpus := make([]time.Duration, len(ops))
	// Interleave, alternating the order each round, so drifting background load on the
	// shared machine falls on every side alike.
	for r := range rounds {
		for k := range ops {
			i := k
			if r%2 == 1 {
				i = len(ops) - 1 - k
			}
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			c0 := benchreport.ProcessCPU()
			s, err := benchreport.MeasureParallel(ops[i].name, workers, n, ops[i].op)
			if err != nil {
				t.Fatal(err)
			}
			cpus[i] += benchreport.ProcessCPU() - c0
			runtime.ReadMemStats(&m1)
			allocs[i] += m1.TotalAlloc - m0.TotalAlloc
			gcs[i] += m1.NumGC - m0.NumGC
			samples[i] = append(samples[i], s)
		}
	}
	a, b, c := merge(ops[0].name, samples[0]...), merge(ops[1].name, samples[1]...), merge(ops[2].name, samples[2]...)
	for _, s := range []benchreport.Sample{a, b, c} {
		benchreport.Print("gateway", s)
	}
	// Background load on the shared machine comes in bursts; the median of the per-round
	// ratios (each round measures both sides back to back) is the robust figure, the ratio
	// of the merged samples is printed beside it.
	perRound := make([]float64, rounds)
	for r := range rounds {
		perRound[r] = samples[2][r].Rate() / samples[1][r].Rate()
	}
	benchreport.Value("gateway", "throughput_ratio_rounds", "%s", benchreport.List(perRound, 3))
	for i, o := range ops {
		benchreport.Value("gateway", o.name+"_heap_alloc", "%d B per request, %d GC cycles in %d requests", allocs[i]/uint64(rounds*n), gcs[i], rounds*n)
		benchreport.Value("gateway", o.name+"_process_cpu", "%.1f µs per request (client included)", float64(cpus[i].Microseconds())/float64(rounds*n))
	}
	slices.Sort(perRound)
	median := (perRound[rounds/2-1] + perRound[rounds/2]) / 2
	benchreport.Ratio("gateway", fmt.Sprintf("throughput airlock/caddy_reverse_proxy (median of %d paired rounds)", rounds), median, "≥", 0.95)
	benchreport.Ratio("gateway", "throughput airlock/caddy_reverse_proxy (all rounds merged)", c.Rate()/b.Rate(), "", 0)
	benchreport.Ratio("gateway", "p99 airlock/caddy_reverse_proxy", float64(c.Quantile(0.99))/float64(b.Quantile(0.99)), "≤", 1.10)
	benchreport.Ratio("gateway", "throughput caddy_reverse_proxy/direct", b.Rate()/a.Rate(), "", 0)
	benchreport.Value("gateway", "route_table_heap", "%d routes, %.1f MiB heap (%.0f B/route)", routes,
		float64(ms1.HeapAlloc-ms0.HeapAlloc)/(1<<20), float64(int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc))/routes)

	// Route propagation: publish a new sandbox, poll through the gateway until it answers.
	poll := benchClient(e.gw.Addr(), 1)
	i := 0
	prop, err := benchreport.Measure("route_propagation_put_to_first_200", 50, func() error {
		id := fmt.Sprintf("prop-%03d", i)
		i++
		get := benchGet(poll, e.base()+"/plain", e.hostOf(itoa(up.port)+"-"+id))
		e.hub.Put(runningSandbox(id, up.addr))
		deadline := time.Now().Add(10 * time.Second)
		for get() != nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not routable after 10s", id)
			}
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Print("gateway", prop)
	if sink.n.Load() == 0 {
		t.Fatal("no audit records during the benchmark")
	}
	// The handler's own CPU cost per request (routing among 10k routes, access, rewrite,
	// metrics, audit record), without network and proxy.
	hb, sb := testing.Benchmark(BenchmarkHandlerOverhead), testing.Benchmark(BenchmarkRequestSetup)
	benchreport.Value("gateway", "handler_overhead", "%d ns/op, %d allocs/op over the request setup baseline",
		hb.NsPerOp()-sb.NsPerOp(), hb.AllocsPerOp()-sb.AllocsPerOp())
	// The same on execd's port admitted by the access token: the credential check's cost.
	tb := testing.Benchmark(BenchmarkHandlerOverheadToken)
	benchreport.Value("gateway", "handler_overhead_token", "%d ns/op, %d allocs/op over the request setup baseline (token check included)",
		tb.NsPerOp()-sb.NsPerOp(), tb.AllocsPerOp()-sb.AllocsPerOp())
}

var benchPlainPort string

// newEnvWith is newEnv with a hook that edits the Caddy JSON before it is loaded.
func newEnvWith(t *testing.T, mod func(*Config), edit func(map[string]any)) *env {
	t.Helper()
	benchPlainPort = freePort(t)
	return newEnvEdit(t, mod, func(raw []byte) []byte {
		var cfg map[string]any
		if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		edit(cfg)
		out, _ := json.Marshal(cfg)
		return out
	}, nil)
}
