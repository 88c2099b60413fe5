package audit_test

import (
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestBenchAuditOCSF measures the writer's durable record throughput (TryAppend from
// 4 goroutines until the last record is fsync'd, as TestBenchAuditAppend) with the
// OCSF export off and on in 9 pairs of runs, back to back in alternating order: the
// export must not slow the chain by more than 10 % (target on the median of the pairs'
// ratios; the ratio of each side's best run is printed beside it, which one lucky run
// moves: 0.85 once with every pair within 1 % of 1.0). It also prints how long the
// export took to catch up (Close returns once every record is exported).
func TestBenchAuditOCSF(t *testing.T) {
	testenv.NeedBench(t)
	const n, workers, runs = 200_000, 4, 9
	recs := []audit.Record{
		{SandboxID: "sb-bench", Source: audit.SourceDNS, Proto: "udp", Src: "10.88.0.5:40000", DstHost: "pypi.org", QType: "A",
			Action: "allow", Mode: "enforce", Rule: "egress[0]", Reason: "allow pypi.org ports 443 tcp (policy.yaml:12)", PolicyVersion: 3,
			Extra: map[string]any{"answers": []string{"151.101.0.223", "151.101.64.223"}, "rcode": "NOERROR", "ttl_s": 300}},
		{SandboxID: "sb-bench", Source: audit.SourceBPF, Proto: "tcp", Src: "10.88.0.5:41000", DstIP: "203.0.113.7", DstPort: 443,
			Action: "deny", Mode: "enforce", Rule: "egress[2]", Reason: "default_deny", PolicyVersion: 3,
			Extra: map[string]any{"backend": "ebpf", "packets": uint64(3), "bytes": uint64(180)}},
	}
	run := func(export bool) (durable float64, complete time.Duration) {
		benchreport.Settle() // none pays for the one before it
		dir := t.TempDir()
		cfg := audit.Config{Dir: dir, QueueSize: 1 << 16}
		if export {
			ex, err := ocsf.New(ocsf.Config{ChainDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Sink = ex
		}
		w, err := audit.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var i atomic.Uint64
		start := time.Now()
		name := fmt.Sprintf("append durable, OCSF export %v", map[bool]string{true: "on", false: "off"}[export])
		d, err := benchreport.MeasureParallel(name, workers, n, func() error {
			r := recs[i.Add(1)%2]
			for !w.TryAppend(r) {
				time.Sleep(50 * time.Microsecond)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for w.Synced() < uint64(n) {
			time.Sleep(time.Millisecond)
		}
		d.Wall = time.Since(start)
		benchreport.Print("audit", d)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return d.Rate(), time.Since(start)
	}
	var catchUp []time.Duration
	off, on, paired := benchreport.Paired(runs, func(export bool) float64 {
		r, c := run(export)
		if export {
			catchUp = append(catchUp, c)
		}
		return r
	})
	sort.Slice(catchUp, func(i, j int) bool { return catchUp[i] < catchUp[j] })
	benchreport.Value("audit", "OCSF export complete", "%d records exported in %s (median, from the first Append until Close returned)",
		n, catchUp[len(catchUp)/2].Round(time.Millisecond))
	benchreport.Value("audit", "OCSF export on / off pairs", "%s", benchreport.List(paired, 3))
	benchreport.Ratio("audit", "durable records/s with OCSF export on / off (median of paired runs)", benchreport.Median(paired), "≥", 0.9)
	benchreport.Ratio("audit", "durable records/s with OCSF export on / off (best runs)", slices.Max(on)/slices.Max(off), "", 0)
}
