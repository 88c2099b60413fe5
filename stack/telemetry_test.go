package stack

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/otlp"
	"github.com/airlockdev/airlock/internal/otlptest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// TestTelemetryOTLP: a real stack with telemetry.otlp.endpoint set to a collector's
// OTLP receiver (the collector's otlpreceiver, in process) creates a sandbox and runs a
// command; the collector receives the chain's records as log records (every seq the
// chain holds, with its hash), the derived and airlock_* metrics, and one trace with
// the create's spans under the API's server span: lifecycle.create → runtime.create,
// egressd.attach (egressd, through the watch stream's traceparent) and lifecycle.ready
// with the egress.enforced and execd.released events.
func TestTelemetryOTLP(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	col := otlptest.Start(t)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	s, c := startTestStack(t, func(cfg *Config) {
		cfg.Telemetry.OTLP.Endpoint = col.Endpoint
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if ex, err := x.Run(ctx, sdk.Command{Command: "echo otlp"}, nil); err != nil || ex.ExitCode() != 0 {
		t.Fatalf("run: %+v %v", ex, err)
	}

	// Logs: every record of the chain, by seq and hash.
	chain := map[int64]string{}
	wait(t, "the collector to hold every chain record", func() bool {
		clear(chain)
		if err := audit.Scan(s.AuditDir(), audit.Filter{}, func(r audit.Record) error {
			chain[int64(r.Seq)] = r.Hash
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		got := map[int64]string{}
		for _, ld := range col.Logs.AllLogs() {
			for _, rl := range ld.ResourceLogs().All() {
				for _, sl := range rl.ScopeLogs().All() {
					for _, lr := range sl.LogRecords().All() {
						seq, _ := lr.Attributes().Get(otlp.AttrSeq)
						hash, _ := lr.Attributes().Get(otlp.AttrHash)
						got[seq.Int()] = hash.Str()
					}
				}
			}
		}
		for seq, hash := range chain {
			if got[seq] != hash {
				return false
			}
		}
		return len(chain) > 0 && len(got) == len(chain)
	})
	var execd bool
	if err := audit.Scan(s.AuditDir(), audit.Filter{SandboxID: sb.ID}, func(r audit.Record) error {
		execd = execd || r.Source == audit.SourceExecd
		return nil
	}); err != nil || !execd {
		t.Fatalf("the chain has no execd record of the command (%v)", err)
	}

	// Metrics: the derived execd count and a Prometheus-bridged airlock_* metric.
	wait(t, "the metrics", func() bool {
		names := map[string]bool{}
		for _, md := range col.Metrics.AllMetrics() {
			for _, rm := range md.ResourceMetrics().All() {
				for _, sm := range rm.ScopeMetrics().All() {
					for _, m := range sm.Metrics().All() {
						names[m.Name()] = true
					}
				}
			}
		}
		var prom bool
		for n := range names {
			prom = prom || strings.HasPrefix(n, "airlock_")
		}
		return names[otlp.MetricExecutions] && names[otlp.MetricExecdRequests] && prom
	})

	// Traces: the create's spans in one trace.
	wait(t, "the create's trace", func() bool {
		spans := map[string]ptrace.Span{}
		for _, td := range col.Traces.AllTraces() {
			for _, rs := range td.ResourceSpans().All() {
				for _, ss := range rs.ScopeSpans().All() {
					for _, sp := range ss.Spans().All() {
						if id, ok := sp.Attributes().Get("osbx.id"); ok && id.Str() != sb.ID {
							continue
						}
						spans[sp.Name()] = sp
					}
				}
			}
		}
		create, ok1 := spans["lifecycle.create"]
		rt, ok2 := spans["runtime.create"]
		ready, ok3 := spans["lifecycle.ready"]
		api, ok4 := spans["airlock.api POST"]
		attach, ok5 := spans["egressd.attach"]
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return false
		}
		events := map[string]bool{}
		for _, e := range ready.Events().All() {
			events[e.Name()] = true
		}
		if !events["execd.released"] || !events["egress.enforced"] || attach.ParentSpanID() != create.SpanID() {
			return false
		}
		return rt.ParentSpanID() == create.SpanID() && ready.ParentSpanID() == create.SpanID() &&
			create.ParentSpanID() == api.SpanID() && create.TraceID() == api.TraceID() && ready.TraceID() == api.TraceID()
	})
}

func wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
