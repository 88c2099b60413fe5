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
// OCSF export off and on, alternating, 5 runs each: the export must not slow the chain
// by more than 10 % (target on the best run of each side, the figure least disturbed
// by other load on the machine; the median ratio is printed beside it). It also prints how long the export took to catch up
// (Close returns once every record is exported).
func TestBenchAuditOCSF(t *testing.T) {
	testenv.NeedBench(t)
	const n, workers, runs = 200_000, 4, 5
	recs := []audit.Record{
		{SandboxID: "sb-bench", Source: audit.SourceDNS, Proto: "udp", Src: "10.88.0.5:40000", DstHost: "pypi.org", QType: "A",
			Action: "allow", Mode: "enforce", Rule: "egress[0]", Reason: "allow pypi.org ports 443 tcp (policy.yaml:12)", PolicyVersion: 3,
			Extra: map[string]any{"answers": []string{"151.101.0.223", "151.101.64.223"}, "rcode": "NOERROR", "ttl_s": 300}},
		{SandboxID: "sb-bench", Source: audit.SourceBPF, Proto: "tcp", Src: "10.88.0.5:41000", DstIP: "203.0.113.7", DstPort: 443,
			Action: "deny", Mode: "enforce", Rule: "egress[2]", Reason: "default_deny", PolicyVersion: 3,
			Extra: map[string]any{"backend": "ebpf", "packets": uint64(3), "bytes": uint64(180)}},
	}
	run := func(export bool) (durable float64, complete time.Duration) {
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
	var off, on []float64
	var catchUp []time.Duration
	for range runs {
		r, _ := run(false)
		off = append(off, r)
		r, c := run(true)
		on = append(on, r)
		catchUp = append(catchUp, c)
	}
	median := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	sort.Slice(catchUp, func(i, j int) bool { return catchUp[i] < catchUp[j] })
	benchreport.Value("audit", "OCSF export complete", "%d records exported in %s (median, from the first Append until Close returned)",
		n, catchUp[len(catchUp)/2].Round(time.Millisecond))
	benchreport.Ratio("audit", "durable records/s with OCSF export on / off (median of runs)", median(on)/median(off), "", 0)
	benchreport.Ratio("audit", "durable records/s with OCSF export on / off (best runs)", slices.Max(on)/slices.Max(off), "≥", 0.9)
}
