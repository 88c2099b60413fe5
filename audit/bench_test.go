package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestBenchAuditAppend measures the writer with fsync batching on (100 ms): the cost of
// Append on the caller (the data path), and durable throughput (records/s from the first
// Append until the last record is fsync'd), side by side with plain JSON Lines writing of
// the same records without chain or fsync.
func TestBenchAuditAppend(t *testing.T) {
	testenv.NeedBench(t)
	const n, workers = 300_000, 4
	w, err := New(Config{Dir: t.TempDir(), QueueSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	r := rec("sb-bench", 1)
	start := time.Now()
	s, err := benchreport.MeasureParallel("append (caller side, lossy when full)", workers, n, func() error {
		w.Append(r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Print("audit", s)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(w.cfg.Dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Value("audit", "append lossy", "%d appended in %s, %d lost (all recorded in loss records)", n, time.Since(start).Round(time.Millisecond), rep.Lost)

	// the same with the servers' rate limit on (one token bucket per sandbox): the
	// caller-side cost of the limiter; the one sandbox is mostly suppressed
	wl, err := New(Config{Dir: t.TempDir(), QueueSize: 1 << 16, RateLimit: DefaultRateLimit()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := benchreport.MeasureParallel("append with DefaultRateLimit (caller side)", workers, n, func() error {
		wl.Append(r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wl.Close()
	benchreport.Print("audit", l)

	// durable throughput without losses: TryAppend with backoff, until fsync'd
	w2, err := New(Config{Dir: t.TempDir(), QueueSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	d, err := benchreport.MeasureParallel("append durable (TryAppend, until fsync'd)", workers, n, func() error {
		for !w2.TryAppend(r) {
			time.Sleep(50 * time.Microsecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for w2.Synced() < uint64(n) {
		time.Sleep(time.Millisecond)
	}
	d.Wall = time.Since(start)
	w2.Close()
	benchreport.Print("audit", d)

	// baseline: the same records as plain JSON Lines (no chain, no fsync), one writer
	f, err := os.Create(filepath.Join(t.TempDir(), "plain.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 0, 1<<20)
	p, err := benchreport.Measure("plain json lines (no chain, no fsync)", n, func() error {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = append(append(buf, b...), '\n')
		if len(buf) > 1<<20-1024 {
			_, err = f.Write(buf)
			buf = buf[:0]
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Print("audit", p)
	benchreport.Ratio("audit", "durable chained records/s / plain JSON Lines records/s", d.Rate()/p.Rate(), "", 0)
}
