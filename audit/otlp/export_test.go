package otlp_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/audit/otlp"
	"github.com/airlockdev/airlock/internal/otlptest"
)

// sample is a record of each kind the derived metrics count, plus a policy change.
func sample(now time.Time) []audit.Record {
	return []audit.Record{
		{Time: now, SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp", DstHost: "pypi.org", QType: "A", Action: "allow"},
		{Time: now, SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp", DstHost: "evil.example", QType: "A", Action: "deny"},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "203.0.113.7", DstPort: 443, Action: "deny"},
		{Time: now, SandboxID: "sb1", Source: audit.SourceGateway, Proto: "http", Action: "allow",
			Extra: map[string]any{"route": "header", "status": 200, "method": "GET", "duration_ms": 1.5, "request_id": "r1"}},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Action: "allow",
			Extra: map[string]any{"op": "command", "status": 200, "duration_ms": 12.0, "execution_ms": 10.0, "exit_code": 3,
				"outcome": "failure", "command": "false", "entry": "gateway", "request_id": "r2"}},
		{Time: now, SandboxID: "sb1", Source: audit.SourcePolicy, Src: "127.0.0.1:5000", Action: "allow", PolicyVersion: 2,
			Reason: "policy replaced"},
	}
}

func write(t *testing.T, dir string, recs []audit.Record) {
	t.Helper()
	w, err := audit.New(audit.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		w.Append(r)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// events is what the chain holds, as the OCSF lines each OTLP log record must carry.
func events(t *testing.T, dir string) (lines []string, seqs []int64, hashes []string) {
	t.Helper()
	m := ocsf.Mapper{Host: "h"}
	if err := audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
		for _, l := range strings.Split(strings.TrimSuffix(string(m.Append(nil, &r)), "\n"), "\n") {
			lines, seqs, hashes = append(lines, l), append(seqs, int64(r.Seq)), append(hashes, r.Hash)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return
}

func logsExporter(t *testing.T, endpoint string) *otlploghttp.Exporter {
	t.Helper()
	ex, err := otlploghttp.New(context.Background(), otlploghttp.WithEndpointURL(endpoint+"/v1/logs"),
		otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}), otlploghttp.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// received is what the collector got: body, seq and hash of every log record.
func received(col *otlptest.Collector) (bodies []string, seqs []int64, hashes []string) {
	for _, ld := range col.Logs.AllLogs() {
		for _, rl := range ld.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					bodies = append(bodies, lr.Body().Str())
					seq, _ := lr.Attributes().Get(otlp.AttrSeq)
					hash, _ := lr.Attributes().Get(otlp.AttrHash)
					seqs, hashes = append(seqs, seq.Int()), append(hashes, hash.Str())
				}
			}
		}
	}
	return
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLogsEqualTheChain: a real OTLP receiver (the collector's otlpreceiver) gets one
// log record per OCSF event of every record in the chain, each naming its chain
// record by seq and hash, in order, with nothing lost or added.
func TestLogsEqualTheChain(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, sample(time.Now()))
	col := otlptest.Start(t)
	ex, err := otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, col.Endpoint), Host: "h",
		Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	want, wantSeq, wantHash := events(t, dir)
	if len(want) != 6 {
		t.Fatalf("chain has %d OCSF events, want 6 (one per record)", len(want))
	}
	waitFor(t, "the collector to receive every event", func() bool { return col.Logs.LogRecordCount() >= len(want) })
	time.Sleep(200 * time.Millisecond) // nothing more may follow
	got, gotSeq, gotHash := received(col)
	if len(got) != len(want) {
		t.Fatalf("collector received %d log records, chain has %d events", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] || gotSeq[i] != wantSeq[i] || gotHash[i] != wantHash[i] {
			t.Fatalf("log record %d:\n got seq %d hash %s %s\nwant seq %d hash %s %s", i, gotSeq[i], gotHash[i], got[i],
				wantSeq[i], wantHash[i], want[i])
		}
	}
	waitFor(t, "the position", func() bool { return ex.Exported() == 6 })
}

// TestExportYieldsToABusyWriter: while the writer keeps writing (Progress moves at
// every poll), the export waits MaxLag from when it fell behind before it reads the
// chain, not from its start (it read at its first poll, in the middle of a burst).
func TestExportYieldsToABusyWriter(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, sample(time.Now()))
	col := otlptest.Start(t)
	var progress atomic.Uint64
	progress.Store(6)
	const maxLag = 600 * time.Millisecond
	start := time.Now()
	ex, err := otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, col.Endpoint), Host: "h",
		Poll: 20 * time.Millisecond, Quiet: time.Hour, MaxLag: maxLag,
		Progress: func() uint64 { return progress.Add(1) }}) // a writer that never stops
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	time.Sleep(maxLag / 2)
	if n := ex.Exported(); n != 0 {
		t.Fatalf("exported up to seq %d after %s, with the writer busy and MaxLag %s", n, time.Since(start).Round(time.Millisecond), maxLag)
	}
	waitFor(t, "the export after MaxLag", func() bool { return ex.Exported() == 6 })
	if d := time.Since(start); d < maxLag {
		t.Fatalf("exported after %s, before MaxLag %s", d, maxLag)
	}
}

// TestNothingLostWhileTheReceiverIsDown: exports to a receiver that is not there fail
// and are retried, the position does not move, and a restart against a live receiver
// delivers every record exactly once.
func TestNothingLostWhileTheReceiverIsDown(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, sample(time.Now()))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	ex, err := otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, dead), Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed export", func() bool { return ex.Failures() >= 2 })
	if got := ex.Exported(); got != 0 {
		t.Fatalf("position moved to %d with the receiver down", got)
	}
	ex.Close()
	if b, err := os.ReadFile(filepath.Join(dir, otlp.DirName, "position")); err == nil && !bytes.Equal(b, []byte("0\n")) {
		t.Fatalf("position file %q after failed exports", b)
	}
	col := otlptest.Start(t)
	ex, err = otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, col.Endpoint), Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	want, _, _ := events(t, dir)
	waitFor(t, "the backlog", func() bool { return col.Logs.LogRecordCount() >= len(want) })
	waitFor(t, "the position", func() bool { return ex.Exported() == 6 })
	ex.Close()
	// A third start finds the position and sends nothing again.
	ex, err = otlp.New(otlp.Config{ChainDir: dir, Logs: logsExporter(t, col.Endpoint), Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := col.Logs.LogRecordCount(); n != len(want) {
		t.Fatalf("collector has %d log records after a restart, want %d (sent again)", n, len(want))
	}
}

// TestDerivedMetrics: the OSEP-0010 metrics counted from records written while the
// exporter runs reach the collector, with bounded attributes and no host names.
func TestDerivedMetrics(t *testing.T) {
	dir := t.TempDir()
	col := otlptest.Start(t)
	mex, err := otlpmetrichttp.New(context.Background(), otlpmetrichttp.WithEndpointURL(col.Endpoint+"/v1/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mex, sdkmetric.WithInterval(100*time.Millisecond))))
	defer mp.Shutdown(context.Background())
	// The writer starts first (the exporter follows its files), records come after.
	w, err := audit.New(audit.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := otlp.New(otlp.Config{ChainDir: dir, Meter: mp, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	for _, r := range sample(time.Now()) {
		w.Append(r)
	}
	w.Close()
	waitFor(t, "the records", func() bool { return ex.Exported() == 6 })
	sums := map[string]int64{}
	var hosts bool
	waitFor(t, "the metrics", func() bool {
		for k := range sums {
			delete(sums, k)
		}
		for _, md := range col.Metrics.AllMetrics() {
			for _, rm := range md.ResourceMetrics().All() {
				for _, sm := range rm.ScopeMetrics().All() {
					for _, m := range sm.Metrics().All() {
						if m.Type() != pmetric.MetricTypeSum {
							continue
						}
						for _, dp := range m.Sum().DataPoints().All() {
							key := m.Name()
							for k, v := range dp.Attributes().All() {
								key += " " + k + "=" + v.AsString()
								if strings.Contains(v.AsString(), "pypi.org") || strings.Contains(v.AsString(), "203.0.113.7") {
									hosts = true
								}
							}
							sums[key] = dp.IntValue() // cumulative: the newest wins
						}
					}
				}
			}
		}
		return sums["egress.policy.denied_total source=dns"] == 1 && sums["execd.execution.count result=failure"] == 1
	})
	for key, want := range map[string]int64{
		"egress.policy.evaluations.count action=allow source=dns":                                          1,
		"egress.policy.evaluations.count action=deny source=dns":                                           1,
		"egress.policy.denied_total source=bpf":                                                            1,
		"egress.dns.query.count action=deny":                                                               1,
		"ingress.http.request.count http.request.method=GET http.response.status_code=200 proxy_type=http": 1,
		"execd.http.request.count http.response.status_code=200 operation=command":                         1,
	} {
		if sums[key] != want {
			t.Errorf("%s = %d, want %d (have %v)", key, sums[key], want, sums)
		}
	}
	if hosts {
		t.Error("a metric attribute names a host or address")
	}
}
