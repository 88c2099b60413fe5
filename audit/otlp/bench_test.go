package otlp_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/audit/otlp"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/otlptest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestBenchAuditExport measures the writer's durable record throughput (TryAppend from
// 4 goroutines until the last record is fsync'd) with every export off and with the
// OCSF files and the OTLP logs and metrics (to the collector's receiver, in process)
// on, in 9 pairs of runs, back to back in alternating order (issue 26's target: ≥ 0.9×,
// on the median of the pairs' ratios; the ratio of each side's best run beside it). It
// also prints how long the OTLP export took to deliver every record after the first
// Append.
func TestBenchAuditExport(t *testing.T) {
	testenv.NeedBench(t)
	const n, workers, runs = 100_000, 4, 9
	recs := sample(time.Now())[:3]
	col := otlptest.Start(t)
	run := func(export bool) (durable float64, delivered time.Duration) {
		// The in-process collector keeps what it receives: drop the last run's, and start
		// each run settled, so that no run pays for the one before it (the kept logs made
		// the export's runs slower the more of them had gone before).
		col.Logs.Reset()
		col.Metrics.Reset()
		benchreport.Settle()
		dir := t.TempDir()
		cfg := audit.Config{Dir: dir, QueueSize: 1 << 16}
		var ex *otlp.Exporter
		var mp *sdkmetric.MeterProvider
		if export {
			oc, err := ocsf.New(ocsf.Config{ChainDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Sink = oc
			mex, err := otlpmetrichttp.New(context.Background(), otlpmetrichttp.WithEndpointURL(col.Endpoint+"/v1/metrics"))
			if err != nil {
				t.Fatal(err)
			}
			mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mex)))
		}
		w, err := audit.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if export {
			if ex, err = otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, col.Endpoint), Meter: mp, Progress: w.Written}); err != nil {
				t.Fatal(err)
			}
		}
		var i atomic.Uint64
		start := time.Now()
		name := fmt.Sprintf("append durable, OCSF + OTLP export %v", map[bool]string{true: "on", false: "off"}[export])
		d, err := benchreport.MeasureParallel(name, workers, n, func() error {
			r := recs[i.Add(1)%uint64(len(recs))]
			r.Time = time.Now()
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
		if ex != nil {
			for ex.Exported() < uint64(n) {
				time.Sleep(5 * time.Millisecond)
			}
			delivered = time.Since(start)
			ex.Close()
			mp.Shutdown(context.Background())
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return d.Rate(), delivered
	}
	var delivered []time.Duration
	off, on, paired := benchreport.Paired(runs, func(export bool) float64 {
		r, c := run(export)
		if export {
			delivered = append(delivered, c)
		}
		return r
	})
	slices.Sort(delivered)
	benchreport.Value("audit", "OTLP export complete", "%d records delivered to the collector in %s (median, from the first Append)",
		n, delivered[len(delivered)/2].Round(time.Millisecond))
	benchreport.Value("audit", "OCSF + OTLP export on / off pairs", "%s", benchreport.List(paired, 3))
	benchreport.Ratio("audit", "durable records/s with OCSF + OTLP export on / off (median of paired runs)", benchreport.Median(paired), "≥", 0.9)
	benchreport.Ratio("audit", "durable records/s with OCSF + OTLP export on / off (best runs)", slices.Max(on)/slices.Max(off), "", 0)
}
