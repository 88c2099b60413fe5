package ocsf

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/record"
)

// gatewayRecord is a record shaped as the gateway's per request (gateway/audit.go):
// numbers as float64, as the record reads back.
func gatewayRecord() record.Record {
	return record.Record{Time: time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC), SandboxID: "bench-real",
		Source: record.SourceGateway, Proto: "http", Src: "127.0.0.1:51234", DstHost: "8080-bench-real.airlock.localhost:8081",
		DstIP: "10.88.0.5", DstPort: 8080, Action: "allow", Reason: "public", Rule: "access:public",
		Extra: map[string]any{"route": "host", "status": float64(200), "bytes": float64(1 << 14), "duration_ms": 1.234,
			"request_id": "2f1c0a9e6b7d4c3a", "method": "GET", "result": "proxied", "principal": "key-0001"}}
}

// BenchmarkGatewayEvent is the export's work per gateway request record held in
// memory: read back (record.ReadBack) and mapped to its HTTP Activity event.
func BenchmarkGatewayEvent(b *testing.B) {
	r := gatewayRecord()
	r.Seq = 42
	r.Prev = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	r.Hash = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
	m := Mapper{Host: "bench"}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		rb := record.ReadBack(&r)
		buf = m.Append(buf[:0], &rb)
	}
	b.ReportMetric(float64(len(buf)), "bytes/event")
}

// BenchmarkGatewayPipeline is the whole audit of gateway requests off their request
// goroutines: 8 goroutines at a request's pace (a 100 µs sleep each) Append gateway
// records to a writer (default linger), with the OCSF export (export) or without it
// (chain), until every record is written and exported; none builds the records and
// drops them. cpu-µs/record is the process's CPU time (user and system) per record,
// everything included: the difference between two of them is what the audit costs.
func BenchmarkGatewayPipeline(b *testing.B) {
	for _, mode := range []string{"none", "chain", "export"} {
		b.Run(mode, func(b *testing.B) { benchPipeline(b, mode) })
	}
}

func benchPipeline(b *testing.B, mode string) {
	dir := b.TempDir()
	cfg := audit.Config{Dir: dir}
	var ex *Exporter
	if mode == "export" {
		var err error
		if ex, err = New(Config{ChainDir: dir}); err != nil {
			b.Fatal(err)
		}
		cfg.Sink = ex
	}
	var w *audit.Writer
	if mode != "none" {
		var err error
		if w, err = audit.New(cfg); err != nil {
			b.Fatal(err)
		}
		defer w.Close()
	}
	r := gatewayRecord()
	runtime.GC()
	cpu0 := processCPU()
	var n atomic.Uint64
	var sink atomic.Pointer[map[string]any]
	b.ReportAllocs()
	b.SetParallelism(4) // 8 goroutines on 2 cores, the gateway bench's workers
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rr := r
			rr.Time = time.Now()
			rr.Extra = map[string]any{"route": "host", "status": float64(200), "bytes": float64(n.Add(1)), "duration_ms": 1.234,
				"request_id": fmt.Sprint(n.Load()), "method": "GET", "result": "proxied", "principal": "key-0001"}
			if w != nil {
				w.Append(rr)
			} else {
				sink.Store(&rr.Extra)
			}
			time.Sleep(100 * time.Microsecond) // a request's pace, not a burst
		}
	})
	for w != nil && w.Written() < n.Load() || ex != nil && ex.Exported() < n.Load() {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric((processCPU()-cpu0).Seconds()*1e6/float64(n.Load()), "cpu-µs/record")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
