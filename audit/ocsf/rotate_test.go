package ocsf

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// many returns n flow and DNS records.
func many(n int) []audit.Record {
	recs := records()
	out := make([]audit.Record, n)
	for i := range out {
		out[i] = recs[i%4]
		out[i].Time = time.Now()
	}
	return out
}

// exportedSeqs are the chain seqs of the events, in file order.
func exportedSeqs(t *testing.T, dir string) []uint64 {
	t.Helper()
	events, _ := readEvents(t, dir)
	var seqs []uint64
	for _, ev := range events {
		md := ev["metadata"].(map[string]any)
		n, _ := strconv.ParseUint(md["original_event_uid"].(string), 10, 64)
		seqs = append(seqs, n)
	}
	return seqs
}

// wantSeqs checks that seqs are from..to, each once, in order.
func wantSeqs(t *testing.T, seqs []uint64, from, to uint64) {
	t.Helper()
	if uint64(len(seqs)) != to-from+1 {
		t.Fatalf("%d events exported, want seqs %d..%d", len(seqs), from, to)
	}
	for i, s := range seqs {
		if s != from+uint64(i) {
			t.Fatalf("event %d is seq %d, want %d", i, s, from+uint64(i))
		}
	}
}

// chainFilesOf are the chain's file names.
func chainFilesOf(t *testing.T, dir string) []string {
	t.Helper()
	return chainFiles(dir)
}

// TestExportRotatesWithChain: one OCSF file per chain file, named after it, holding
// exactly that file's records.
func TestExportRotatesWithChain(t *testing.T) {
	dir := writeLog(t, many(3000), 64<<10)
	chain := chainFilesOf(t, dir)
	_, files := readEvents(t, dir)
	if len(chain) < 3 || len(files) != len(chain) {
		t.Fatalf("chain files %v, OCSF files %v", chain, files)
	}
	for i := range chain {
		if files[i] != ocsfName(chain[i]) {
			t.Errorf("OCSF file %s for chain file %s", files[i], chain[i])
		}
	}
	wantSeqs(t, exportedSeqs(t, dir), 1, 3000)
	// each OCSF file starts with its chain file's first record
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, DirName, name))
		if err != nil {
			t.Fatal(err)
		}
		first := fileFirst(strings.TrimSuffix(name, ".ocsf.jsonl") + ".jsonl")
		if !strings.Contains(strings.SplitN(string(b), "\n", 2)[0], fmt.Sprintf(`"original_event_uid":"%d"`, first)) {
			t.Errorf("%s does not start with seq %d", name, first)
		}
	}
}

// TestExportRetainedWithChain: files the chain's retention deletes lose their OCSF
// file too.
func TestExportRetainedWithChain(t *testing.T) {
	dir := t.TempDir()
	ex, err := New(Config{ChainDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, Sink: ex, MaxFileBytes: 32 << 10, Linger: -1,
		Retention: audit.Retention{MaxBytes: 100 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range many(4000) {
		for !w.TryAppend(r) {
			time.Sleep(time.Millisecond)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	chain := chainFilesOf(t, dir)
	_, files := readEvents(t, dir)
	if len(chain) == 0 || len(files) != len(chain) {
		t.Fatalf("chain files %v, OCSF files %v", chain, files)
	}
	for i := range chain {
		if files[i] != ocsfName(chain[i]) {
			t.Errorf("OCSF file %s for chain file %s", files[i], chain[i])
		}
	}
	if fileFirst(chain[0]) == 1 {
		t.Fatalf("retention removed nothing: %v", chain)
	}
	seqs := exportedSeqs(t, dir)
	wantSeqs(t, seqs, fileFirst(chain[0]), 4000)
}

// TestExportRestart: a writer reopened on the log continues the export without gap or
// duplicate; a log written without the export gets its current file exported when the
// export is turned on; a torn last event is cut and written again; a stream longer than
// MaxLag is exported while it is written.
func TestExportRestart(t *testing.T) {
	dir := t.TempDir()
	open := func(sink bool, lag time.Duration) *audit.Writer {
		cfg := audit.Config{Dir: dir, Linger: -1}
		if sink {
			ex, err := New(Config{ChainDir: dir, MaxLag: lag})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Sink = ex
		}
		w, err := audit.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	write := func(w *audit.Writer, n int) {
		for _, r := range many(n) {
			w.Append(r)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(open(false, 0), 100) // no export yet
	write(open(true, 0), 100)  // turned on: 1..200
	wantSeqs(t, exportedSeqs(t, dir), 1, 200)
	write(open(true, 0), 50) // restart
	wantSeqs(t, exportedSeqs(t, dir), 1, 250)
	// a torn last line (crash mid-write) is cut and rewritten
	name := filepath.Join(dir, DirName, ocsfName(chainFilesOf(t, dir)[0]))
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, b[:len(b)-40], 0o600); err != nil {
		t.Fatal(err)
	}
	write(open(true, 0), 50)
	wantSeqs(t, exportedSeqs(t, dir), 1, 300)
	// a lag of 10ms: exported in many rounds while written
	w := open(true, 10*time.Millisecond)
	for _, r := range many(20000) {
		for !w.TryAppend(r) {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, exportedSeqs(t, dir), 1, 20300)
	if _, err := audit.Verify(dir, audit.VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}
