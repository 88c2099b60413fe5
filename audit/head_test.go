package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cutTail removes every record from seq on, as someone hiding the end of the log
// would: the later files go, the file holding seq is cut before it, and the
// checkpoints of the files that changed or went are dropped, so that what remains
// chains and every remaining checkpoint matches its file.
func cutTail(t *testing.T, dir string, seq uint64) {
	t.Helper()
	files, err := logFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var keep []byte
		for _, line := range bytes.SplitAfter(b, []byte("\n")) {
			if len(line) > 0 && LineSeq(bytes.TrimSuffix(line, []byte("\n"))) < seq {
				keep = append(keep, line...)
			}
		}
		switch {
		case len(keep) == 0:
			os.Remove(p)
		case len(keep) < len(b):
			if err := os.WriteFile(p, keep, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cps, err := ReadCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, c := range cps {
		if c.LastSeq < seq {
			line, _ := json.Marshal(c)
			out = append(append(out, line...), '\n')
		}
	}
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), out, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestHeadDetectsTruncatedTail: a log whose end was cut off (the last records, the
// files after them and their checkpoints) still chains, and only the signed head shows
// that records are missing: Verify reports "truncated" as a break, whether the cut is
// inside the active file or across rotated files and their checkpoints; removing the
// head as well is a break with the public key. The log untouched verifies and names
// its head.
func TestHeadDetectsTruncatedTail(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 4096, SigningKey: priv, Logger: quiet})
	for i := range 300 {
		w.Append(rec("sb", i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	strict := VerifyOptions{PublicKey: pub}
	rep, err := Verify(dir, strict)
	if err != nil {
		t.Fatalf("untouched log: %v", err)
	}
	if rep.Head == nil || rep.Head.Seq != 300 || !rep.Head.Signed || rep.Head.AgeSeconds < 0 || rep.Head.AgeSeconds > 60 {
		t.Fatalf("head %+v, want seq 300, signed, just written", rep.Head)
	}
	if rep.Checkpoints < 3 {
		t.Fatalf("%d checkpoints, want several files", rep.Checkpoints)
	}
	cps, _ := ReadCheckpoints(dir)
	for _, tc := range []struct {
		name string
		cut  uint64
	}{
		{"active_file_tail", 296},
		{"files_and_checkpoints", cps[1].LastSeq - 3},
		{"at_a_file_boundary", cps[len(cps)-1].FirstSeq},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := copyDir(t, dir)
			cutTail(t, d, tc.cut)
			// What remains chains: without the head nothing shows the cut.
			os.Rename(filepath.Join(d, HeadFile), filepath.Join(d, "head.saved"))
			if rep, err := Verify(d); err != nil || rep.LastSeq != tc.cut-1 {
				t.Fatalf("the cut log does not chain by itself (%+v, %v): the test cuts wrongly", rep, err)
			}
			os.Rename(filepath.Join(d, "head.saved"), filepath.Join(d, HeadFile))
			for _, opts := range []VerifyOptions{strict, {}} {
				rep, err := Verify(d, opts)
				if !errors.Is(err, ErrBroken) || rep.Broken == nil || !strings.Contains(rep.Broken.Reason, "truncated") {
					t.Fatalf("cut at seq %d (key %v): Verify = %v, broken %+v; want a truncated break", tc.cut, opts.PublicKey != nil, err, rep.Broken)
				}
			}
			// Removing the head too: the key (and the checkpoints' head mark) say it must be there.
			os.Remove(filepath.Join(d, HeadFile))
			for _, opts := range []VerifyOptions{strict, {PublicKey: pub, UnsignedBefore: true}} {
				if _, err := Verify(d, opts); tc.cut > cps[0].LastSeq && !errors.Is(err, ErrBroken) {
					t.Errorf("cut log without its head verified with the public key (%+v): %v", opts, err)
				}
			}
		})
	}

	// A record rewritten at the head's seq (the whole chain recomputed from there)
	// no longer matches the head.
	d := copyDir(t, dir)
	h, _ := ReadHead(d)
	h.Hash = strings.Repeat("ab", 32)
	h.Digest = h.computeDigest()
	h.Sig = ""
	b, _ := json.Marshal(h)
	os.WriteFile(filepath.Join(d, HeadFile), b, 0o600)
	if _, err := Verify(d, strict); !errors.Is(err, ErrBroken) {
		t.Errorf("an unsigned head verified with the public key: %v", err)
	}
	if rep, err := Verify(d); !errors.Is(err, ErrBroken) || !strings.Contains(rep.Broken.Reason, "signed head names") {
		t.Errorf("a head whose hash differs from the record's: %v %+v", err, rep.Broken)
	}
}

// TestHeadFollowsTheWriter: while records are written the head follows within
// HeadInterval (only fsync'd records), a live log verifies against it, and an older
// head put back together with a log cut to match verifies (a replay the head alone
// cannot show) but reports the head's age.
func TestHeadFollowsTheWriter(t *testing.T) {
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, HeadInterval: 50 * time.Millisecond, SyncInterval: 10 * time.Millisecond, Logger: quiet})
	for i := range 100 {
		w.Append(rec("sb", i))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := ReadHead(dir)
		if err == nil && h != nil && h.Seq == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("head %+v %v: the writer never reached seq 100 in its head", h, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	old := copyDir(t, dir)
	if rep, err := Verify(dir); err != nil || rep.Head == nil || rep.Head.Seq != 100 {
		t.Fatalf("live log: %+v %v", rep, err)
	}
	time.Sleep(20 * time.Millisecond)
	for i := range 100 {
		w.Append(rec("sb", 100+i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Replay: cut to 100 and put the head of seq 100 back.
	cutTail(t, dir, 101)
	hb, _ := os.ReadFile(filepath.Join(old, HeadFile))
	os.WriteFile(filepath.Join(dir, HeadFile), hb, 0o600)
	rep, err := Verify(dir)
	if err != nil || rep.Head == nil || rep.Head.Seq != 100 || rep.Head.AgeSeconds <= 0.01 {
		t.Fatalf("replayed head: %+v %v; want a verified log naming the old head and its age", rep, err)
	}
}

// TestHeadWithRetention: files retained away before the first remaining one leave a
// log that verifies against its head.
func TestHeadWithRetention(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 4096, SigningKey: priv, Retention: Retention{MaxBytes: 12 << 10}, Logger: quiet})
	for i := range 1000 {
		w.Append(rec("sb", i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, VerifyOptions{PublicKey: pub})
	if err != nil || rep.RetainedFiles == 0 || rep.Head == nil || rep.Head.Seq != 1000 || rep.LastSeq != 1000 {
		t.Fatalf("retained prefix: %+v %v", rep, err)
	}
	cutTail(t, dir, 990)
	if _, err := Verify(dir, VerifyOptions{PublicKey: pub}); !errors.Is(err, ErrBroken) {
		t.Errorf("retained prefix and a cut tail: %v, want a break", err)
	}
}
