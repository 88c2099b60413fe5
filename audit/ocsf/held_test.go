package ocsf

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// exportWith writes recs through a real audit.Writer (files rotated every 8 KiB) with
// an exporter keeping at most maxHeld records, and returns the directory and the
// exporter.
func exportWith(t *testing.T, recs []audit.Record, maxHeld int, quiet time.Duration) (string, *Exporter) {
	t.Helper()
	dir := t.TempDir()
	export, held := quiet, 0
	if quiet == 0 {
		// only at Close: what is held there does not depend on timing
		export, held = time.Hour, -1
	}
	ex, err := New(Config{ChainDir: dir, Host: "airlock-host", MaxHeld: maxHeld, Quiet: export, MaxLag: export, ExportHeld: held})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, Sink: ex, MaxFileBytes: 8 << 10, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		for !w.TryAppend(r) {
		}
		if quiet > 0 && i%50 == 0 {
			time.Sleep(2 * quiet) // let the export run while the chain is written
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, ex
}

// ocsfFiles reads dir's OCSF files by name.
func ocsfFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, DirName))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, DirName, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// TestExportHeldEqualsChain: the events of records the writer handed over are byte for
// byte those of the same records read back from the chain, whether every record is
// held, none is (MaxHeld < 0) or only some fit (the rest read from the chain), across
// rotations of the chain.
func TestExportHeldEqualsChain(t *testing.T) {
	var recs []audit.Record
	for range 20 {
		recs = append(recs, records()...)
	}
	// As appended, a record's time has nanoseconds and a zone; the chain keeps
	// microseconds in UTC.
	zone := time.FixedZone("UTC+1", 3600)
	for i := range recs {
		recs[i].Time = recs[i].Time.Add(time.Duration(i%1000) * time.Nanosecond).In(zone)
	}
	// Extra values the chain reads back otherwise: an integer float64 cannot hold, a
	// float32, a string that is not UTF-8.
	recs = append(recs, audit.Record{Time: time.Now(), SandboxID: "sb1", Source: audit.SourceGateway, Action: "allow",
		Extra: map[string]any{"big": int64(1<<53 + 1), "ratio": float32(0.1), "raw": "a\xffb", "status": 200}})
	chainDir, chainEx := exportWith(t, recs, -1, 0)
	if chainEx.fromHeld.Load() != 0 || chainEx.fromChain.Load() != uint64(len(recs)) {
		t.Fatalf("MaxHeld -1: %d held, %d read from the chain, want 0 and %d", chainEx.fromHeld.Load(), chainEx.fromChain.Load(), len(recs))
	}
	want := ocsfFiles(t, chainDir)
	if len(want) < 3 {
		t.Fatalf("%d OCSF files: the test needs rotations", len(want))
	}
	for _, tc := range []struct {
		name    string
		maxHeld int
		quiet   time.Duration
	}{{"all held", 0, 0}, {"some held", 40, 0}, {"some held, exported while written", 40, time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			dir, ex := exportWith(t, recs, tc.maxHeld, tc.quiet)
			held, read := ex.fromHeld.Load(), ex.fromChain.Load()
			t.Logf("%d held, %d read from the chain", held, read)
			// Exported while written, every batch may be exported before 40 wait: then
			// nothing is read from the chain, which the other cases cover.
			if held+read != uint64(len(recs)) || held == 0 || tc.maxHeld == 0 && read != 0 || tc.maxHeld > 0 && tc.quiet == 0 && read == 0 {
				t.Fatalf("%d held and %d read from the chain of %d records", held, read, len(recs))
			}
			got := ocsfFiles(t, dir)
			if len(got) != len(want) {
				t.Fatalf("%d OCSF files, want %d", len(got), len(want))
			}
			for name, w := range want {
				if got[name] != w {
					t.Fatalf("%s differs from the export read from the chain:\n%s\nwant\n%s", name, firstDiff(got[name], w), firstDiff(w, got[name]))
				}
			}
		})
	}
}

// firstDiff is a's line where a and b first differ.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	start := i
	for start > 0 && a[start-1] != '\n' {
		start--
	}
	end := i
	for end < len(a) && a[end] != '\n' {
		end++
	}
	return a[start:end]
}

// TestExportHeldStartsExport: a stream that is never quiet and never MaxLag late is
// exported once ExportHeld (MaxHeld/2 by default) records are held, from memory:
// nothing overflows MaxHeld and is read back from the chain.
func TestExportHeldStartsExport(t *testing.T) {
	dir := t.TempDir()
	ex, err := New(Config{ChainDir: dir, Host: "airlock-host", MaxHeld: 200, Quiet: time.Hour, MaxLag: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, Sink: ex, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	for len(recs) < 1000 {
		recs = append(recs, records()...)
	}
	recs = recs[:1000]
	for i, r := range recs {
		for !w.TryAppend(r) {
		}
		if i%5 == 4 {
			time.Sleep(time.Millisecond) // a stream, in small batches: 100 take 20 ms or more
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ex.Exported() < 901 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	exported := ex.Exported()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if exported < 901 {
		t.Errorf("exported up to seq %d before Close, want all but the last ExportHeld", exported)
	}
	if held, read := ex.fromHeld.Load(), ex.fromChain.Load(); held != 1000 || read != 0 {
		t.Errorf("%d held and %d read from the chain of 1000 records, want all held", held, read)
	}
}
