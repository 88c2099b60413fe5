package audit

import (
	"fmt"
	"testing"
	"time"
)

// benchRecords returns n records shaped like the data path's: DNS answers (string,
// bool, []string, int) and gateway requests (int, int64, float64, strings).
func benchRecords(n int) []Record {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	recs := make([]Record, n)
	for i := range recs {
		if i%2 == 0 {
			r := rec("sb-bench", i)
			r.Time = t0.Add(time.Duration(i) * time.Microsecond)
			r.Extra = map[string]any{"rcode": "NOERROR", "cached": true,
				"answers": []string{"151.101.0.223", "151.101.64.223"}, "ttl_s": 300}
			recs[i] = r
			continue
		}
		recs[i] = Record{Time: t0.Add(time.Duration(i) * time.Microsecond), SandboxID: "sb-bench",
			Source: SourceGateway, Proto: "https", Src: "203.0.113.9:51234", DstHost: "sb-bench.example.com",
			DstIP: "10.88.0.5", DstPort: 8080, Action: "allow", Reason: "api key", Rule: "access:private",
			Extra: map[string]any{"route": "host", "status": 200, "bytes": int64(1 << 14), "duration_ms": 1.234,
				"request_id": fmt.Sprintf("req-%d", i), "method": "GET", "result": "proxied"}}
	}
	return recs
}

// BenchmarkWriteBatch seals and writes batches of 256 records (one write(2) per batch,
// no fsync); allocs/op and ns/op are per batch, records/s and allocs/record per record.
func BenchmarkWriteBatch(b *testing.B) {
	const batch = 256
	w, err := open(Config{Dir: b.TempDir(), MaxFileBytes: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	defer w.f.Close()
	src := benchRecords(batch)
	recs := make([]Record, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		copy(recs, src)
		w.writeBatch(recs)
	}
	b.StopTimer()
	if err := w.Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
}
