package audit

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scanAll returns every record of dir.
func scanAll(t *testing.T, dir string) []Record {
	t.Helper()
	var out []Record
	if err := Scan(dir, Filter{}, func(r Record) error { out = append(out, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// suppressedOf sums the suppressed counts of sandbox (or client address src) and source.
func suppressedOf(recs []Record, src Source, sandbox, addr string) (written, suppressed int) {
	for _, r := range recs {
		if r.Source != src || r.SandboxID != sandbox || (addr != "" && !strings.HasPrefix(r.Src, addr)) {
			continue
		}
		if r.Action == ActionSuppressed {
			n, _ := r.Extra["suppressed"].(float64)
			suppressed += int(n)
			continue
		}
		written++
	}
	return written, suppressed
}

// A flood of one sandbox's denied DNS records is cut to its burst plus suppressed
// records that count the rest, while another sandbox's records are all written; a
// flood of gateway refusals from one client address is limited per address.
func TestRateLimitPerSandboxAndClient(t *testing.T) {
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, RateLimit: RateLimit{Rate: 10, Burst: 50, RefusalRate: 5, RefusalBurst: 20}})
	const flood = 5000
	for i := range flood {
		r := rec("sb-flood", i)
		r.Action = "deny"
		w.Append(r)
		if i%100 == 0 {
			w.Append(rec("sb-quiet", i))
		}
		if i%1000 == 0 { // the flooding sandbox's other sources keep their own budgets
			w.Append(Record{SandboxID: "sb-flood", Source: SourceL7, Action: "allow", DstHost: "pypi.org"})
			w.Append(Record{SandboxID: "sb-flood", Source: SourceCredential, Action: "allow", Rule: "pypi"})
		}
		g := Record{Source: SourceGateway, Action: "deny", Src: "203.0.113.9:5000", Reason: "no such sandbox"}
		w.Append(g)
	}
	for i := range 10 {
		w.Append(Record{Source: SourceGateway, Action: "deny", Src: fmt.Sprintf("198.51.100.4:%d", 1000+i)})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := scanAll(t, dir)
	written, suppressed := suppressedOf(recs, SourceDNS, "sb-flood", "")
	if written > 60 || written+suppressed != flood {
		t.Errorf("sb-flood: %d written + %d suppressed, want at most 60 written and %d in all", written, suppressed, flood)
	}
	if q, s := suppressedOf(recs, SourceDNS, "sb-quiet", ""); q != flood/100 || s != 0 {
		t.Errorf("sb-quiet: %d written, %d suppressed; want all %d written", q, s, flood/100)
	}
	for _, src := range []Source{SourceL7, SourceCredential} {
		if n, s := suppressedOf(recs, src, "sb-flood", ""); n != flood/1000 || s != 0 {
			t.Errorf("sb-flood %s: %d written, %d suppressed; want all %d written", src, n, s, flood/1000)
		}
	}
	gw, gs := suppressedOf(recs, SourceGateway, "", "203.0.113.9")
	if gw > 25 || gw+gs != flood {
		t.Errorf("client 203.0.113.9: %d written + %d suppressed, want at most 25 written and %d in all", gw, gs, flood)
	}
	if ow, os := suppressedOf(recs, SourceGateway, "", "198.51.100.4"); ow != 10 || os != 0 {
		t.Errorf("client 198.51.100.4: %d written, %d suppressed; want 10 written", ow, os)
	}
	if _, err := Verify(dir); err != nil {
		t.Fatal(err)
	}
}

// One source's flood fills its share of the queue (and the common part) but another
// source's record still finds room: only the flooding source loses records.
func TestQueueShareSourceCannotEvictAnother(t *testing.T) {
	dir := t.TempDir()
	w, err := open(Config{Dir: dir, QueueSize: 64}) // not started: nothing drains the queue
	if err != nil {
		t.Fatal(err)
	}
	const flood = 1000
	for i := range flood {
		w.Append(rec("sb1", i))
	}
	w.Append(Record{SandboxID: "sb2", Source: SourceGateway, Action: "allow", Reason: "public"})
	if !w.TryAppend(Record{Source: SourcePolicy, Action: "allow", Reason: "policy change"}) {
		t.Error("TryAppend of a policy record failed while only dns flooded")
	}
	go w.run()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := scanAll(t, dir)
	var gw, pol, dns int
	var lost float64
	for _, r := range recs {
		switch {
		case r.Action == ActionLoss:
			if r.Source != SourceDNS {
				t.Errorf("loss record of %s: only dns flooded", r.Source)
			}
			lost += r.Extra["lost"].(float64)
		case r.Source == SourceGateway:
			gw++
		case r.Source == SourcePolicy:
			pol++
		case r.Source == SourceDNS:
			dns++
		}
	}
	if gw != 1 || pol != 1 {
		t.Errorf("gateway %d, policy %d records; want 1 each", gw, pol)
	}
	if dns+int(lost) != flood || dns == 0 {
		t.Errorf("dns: %d written + %v lost, want %d", dns, lost, flood)
	}
}

// Retention deletes the oldest finished files by size and by age; Verify accepts the
// missing prefix (anchored by a checkpoint) and still catches a changed record and a
// missing file in the middle. airlock_audit_disk_bytes reports the files' size.
func TestRetentionBySizeAndAge(t *testing.T) {
	t.Run("size", func(t *testing.T) {
		dir := t.TempDir()
		reg := prometheus.NewRegistry()
		w := newTestWriter(t, Config{Dir: dir, Logger: quiet, MaxFileBytes: 4096, Retention: Retention{MaxBytes: 16 << 10}, Registry: reg})
		for i := range 2000 {
			w.Append(rec("sb1", i))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		files, _ := logFiles(dir)
		total := dirBytes(t, dir, files)
		if total > 16<<10+4096+1024 {
			t.Errorf("%d bytes in %d files, want at most MaxBytes plus a file", total, len(files))
		}
		if got := testutil.ToFloat64(gaugeNamed(t, reg, "airlock_audit_disk_bytes")); int64(got) != total {
			t.Errorf("airlock_audit_disk_bytes = %v, files hold %d", got, total)
		}
		rep, err := Verify(dir)
		if err != nil {
			t.Fatal(err)
		}
		if rep.RetainedFiles == 0 || rep.FirstSeq == 1 || rep.LastSeq != 2000 {
			t.Fatalf("report %+v: want retained files and the chain up to 2000", rep)
		}
		// a changed record in the first remaining file still breaks the chain
		first := filepath.Join(dir, files[0])
		b, _ := os.ReadFile(first)
		if err := os.WriteFile(first, bytes.Replace(b, []byte("host"), []byte("hosT"), 1), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(dir); !errors.Is(err, ErrBroken) {
			t.Errorf("changed record: Verify = %v, want ErrBroken", err)
		}
		os.WriteFile(first, b, 0o600)
		// a file missing in the middle breaks it too
		if len(files) < 4 {
			t.Fatalf("%d files left, want at least 4", len(files))
		}
		os.Remove(filepath.Join(dir, files[len(files)/2]))
		if _, err := Verify(dir); !errors.Is(err, ErrBroken) {
			t.Errorf("file missing in the middle: Verify = %v, want ErrBroken", err)
		}
	})
	t.Run("age", func(t *testing.T) {
		dir := t.TempDir()
		w := newTestWriter(t, Config{Dir: dir, Logger: quiet, MaxFileBytes: 4096, Retention: Retention{MaxAge: 24 * time.Hour}})
		old := time.Now().Add(-48 * time.Hour)
		for i := range 200 {
			r := rec("sb1", i)
			r.Time = old
			w.Append(r)
		}
		for i := range 200 {
			w.Append(rec("sb1", i))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		for _, r := range scanAll(t, dir) {
			if r.Time.Before(time.Now().Add(-24 * time.Hour)) {
				// only the file that also holds new records may keep old ones
				cps, _ := ReadCheckpoints(dir)
				for _, c := range cps {
					if c.FirstSeq <= r.Seq && r.Seq <= c.LastSeq && time.Since(c.LastTime) > 24*time.Hour {
						if _, err := os.Stat(filepath.Join(dir, c.File)); err == nil {
							t.Fatalf("%s (last record %s) is older than MaxAge but kept", c.File, c.LastTime)
						}
					}
				}
			}
		}
		rep, err := Verify(dir)
		if err != nil {
			t.Fatal(err)
		}
		if rep.RetainedFiles == 0 || rep.LastSeq != 400 {
			t.Fatalf("report %+v: want old files retained away and the chain up to 400", rep)
		}
	})
}

func dirBytes(t *testing.T, dir string, files []string) int64 {
	t.Helper()
	var n int64
	for _, f := range files {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

func gaugeNamed(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name}, func() float64 { return mf.GetMetric()[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

var quiet = slog.New(slog.DiscardHandler)
