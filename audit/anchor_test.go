package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// writeAnchored writes n records through a real writer with a dir anchor sink and
// returns the log, the sink and the key pair.
func writeAnchored(t *testing.T, n int, cfg Config) (dir, sink string, pub ed25519.PublicKey, priv ed25519.PrivateKey) {
	t.Helper()
	pub, priv, _ = ed25519.GenerateKey(nil)
	dir, sink = t.TempDir(), t.TempDir()
	cfg.Dir, cfg.SigningKey, cfg.Logger, cfg.Anchors = dir, priv, quiet, []AnchorSink{DirSink{Dir: sink}}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = 4096
	}
	w := newTestWriter(t, cfg)
	for i := range n {
		w.Append(rec("sb", i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, sink, pub, priv
}

func verifyAnchorsIn(t *testing.T, dir, sink string, pub ed25519.PublicKey) (*AnchorReport, error) {
	t.Helper()
	as, err := ReadAnchors(sink)
	if err != nil {
		t.Fatal(err)
	}
	return VerifyAnchors(dir, as, VerifyOptions{PublicKey: pub})
}

// TestAnchorsUntouched: every checkpoint and the last head reach the sink, signed and
// chained (each names the previous digest), and the untouched log agrees with all.
func TestAnchorsUntouched(t *testing.T) {
	dir, sink, pub, _ := writeAnchored(t, 300, Config{})
	as, _ := ReadAnchors(sink)
	cps, _ := ReadCheckpoints(dir)
	nc, lastHead := 0, uint64(0)
	for i, a := range as {
		if a.Kind == AnchorCheckpoint {
			if a.Checkpoint != cps[nc].Hash {
				t.Errorf("anchor %d names checkpoint %.12s, want %.12s", i, a.Checkpoint, cps[nc].Hash)
			}
			nc++
		} else {
			lastHead = a.LastSeq
		}
	}
	if len(cps) < 3 || nc != len(cps) || lastHead != 300 {
		t.Fatalf("%d checkpoint anchors for %d checkpoints, last head anchor %d (want 300)", nc, len(cps), lastHead)
	}
	ar, err := verifyAnchorsIn(t, dir, sink, pub)
	if err != nil || ar.Finding != FindingOK || ar.Checked != len(as) || ar.LastSeq != 300 {
		t.Fatalf("untouched: %+v %v", ar, err)
	}
	// The sink's own chain: an anchor removed from it is caught.
	b, _ := os.ReadFile(filepath.Join(sink, AnchorFile))
	lines := bytes.SplitAfter(b, []byte("\n"))
	os.WriteFile(filepath.Join(sink, AnchorFile), bytes.Join(append(lines[:1:1], lines[2:]...), nil), 0o600)
	if ar, err := verifyAnchorsIn(t, dir, sink, pub); !errors.Is(err, ErrBroken) || ar.Finding != FindingAnchorsBroken {
		t.Errorf("an anchor removed from the sink: %+v %v", ar, err)
	}
}

// rewriteFrom rewrites the log from record seq on as an attacker holding the host's
// signing key would: the record changed, every later hash, every checkpoint from
// that file on (file SHA-256, chain, signature) and the head recomputed and signed.
func rewriteFrom(t *testing.T, dir string, seq uint64, key ed25519.PrivateKey) {
	t.Helper()
	files, _ := logFiles(dir)
	prev := Genesis
	sums := map[string]string{}
	lastHash := map[uint64]string{}
	for _, name := range files {
		p := filepath.Join(dir, name)
		b, _ := os.ReadFile(p)
		var out []byte
		for _, line := range bytes.SplitAfter(b, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			body := line[:len(line)-1]
			s := LineSeq(body)
			canonical, _, hash, _ := lineParts(body)
			if s >= seq {
				if s == seq {
					canonical = bytes.Replace(canonical, []byte(".example.com"), []byte(".innocent.example"), 1)
				}
				h, err := ChainHash(prev, canonical)
				if err != nil {
					t.Fatal(err)
				}
				hash = h
				body = append(append([]byte(nil), canonical[:len(canonical)-1]...), `,"prev":"`+prev+`","hash":"`+hash+`"}`...)
			}
			out = append(append(out, body...), '\n')
			prev, lastHash[s] = hash, hash
		}
		os.WriteFile(p, out, 0o600)
		sum := sha256Hex(out)
		sums[name] = sum
	}
	cps, _ := ReadCheckpoints(dir)
	var cb []byte
	cpPrev := Genesis
	for _, c := range cps {
		c.Prev, c.LastHash, c.FileSHA256 = cpPrev, lastHash[c.LastSeq], sums[c.File]
		c.Hash = c.computeHash()
		c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, mustHex(c.Hash)))
		cpPrev = c.Hash
		line, _ := json.Marshal(c)
		cb = append(append(cb, line...), '\n')
	}
	os.WriteFile(filepath.Join(dir, CheckpointFile), cb, 0o600)
	h, _ := ReadHead(dir)
	h.Hash, h.Checkpoint = lastHash[h.Seq], cpPrev
	h.Digest = h.computeDigest()
	h.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, mustHex(h.Digest)))
	hb, _ := json.Marshal(h)
	os.WriteFile(filepath.Join(dir, HeadFile), hb, 0o600)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestAnchorsDetectRewrite: the chain rewritten with recomputed hashes, checkpoints
// and head re-signed with the host's key verifies on the host alone; against the
// anchors it is "rewritten", naming the first rewritten checkpoint (the file of the
// changed record).
func TestAnchorsDetectRewrite(t *testing.T) {
	dir, sink, pub, priv := writeAnchored(t, 300, Config{})
	cps, _ := ReadCheckpoints(dir)
	target := cps[1]
	rewriteFrom(t, dir, target.FirstSeq+2, priv)
	if _, err := Verify(dir, VerifyOptions{PublicKey: pub}); err != nil {
		t.Fatalf("the rewritten log does not verify on the host (the test rewrites wrongly): %v", err)
	}
	ar, err := verifyAnchorsIn(t, dir, sink, pub)
	if !errors.Is(err, ErrBroken) || ar.Finding != FindingRewritten || ar.RewrittenFile != target.File ||
		ar.Broken.Line != 2 || !strings.Contains(ar.Broken.Reason, target.File) {
		t.Fatalf("rewritten from seq %d (in %s): %+v %v; want rewritten naming checkpoint line 2", target.FirstSeq+2, target.File, ar, err)
	}
	// Rewritten in the active file only (after the last checkpoint): the head anchors.
	dir2, sink2, pub2, priv2 := writeAnchored(t, 301, Config{})
	cps2, _ := ReadCheckpoints(dir2)
	active := cps2[len(cps2)-1].LastSeq + 1
	if active > 301 {
		t.Fatalf("no record after the last checkpoint (%d): change the record count", active-1)
	}
	rewriteFrom(t, dir2, active, priv2)
	if _, err := Verify(dir2, VerifyOptions{PublicKey: pub2}); err != nil {
		t.Fatal(err)
	}
	if ar, err := verifyAnchorsIn(t, dir2, sink2, pub2); !errors.Is(err, ErrBroken) || ar.Finding != FindingRewritten ||
		!strings.Contains(ar.Broken.Reason, "after the last checkpoint") {
		t.Fatalf("rewritten in the active file: %+v %v", ar, err)
	}
}

// TestAnchorsDetectTruncation: the log cut to seq 100 with the signed head of seq
// 100 put back verifies on the host alone (a replay); the anchors name seq 300.
func TestAnchorsDetectTruncation(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir, sink := t.TempDir(), t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 4096, SigningKey: priv, Logger: quiet, HeadInterval: 20 * time.Millisecond,
		SyncInterval: 5 * time.Millisecond, Anchors: []AnchorSink{DirSink{Dir: sink}}})
	for i := range 100 {
		w.Append(rec("sb", i))
	}
	deadline := time.Now().Add(5 * time.Second)
	for h, _ := ReadHead(dir); h == nil || h.Seq != 100; h, _ = ReadHead(dir) {
		if time.Now().After(deadline) {
			t.Fatal("the head never reached seq 100")
		}
		time.Sleep(5 * time.Millisecond)
	}
	old, _ := os.ReadFile(filepath.Join(dir, HeadFile))
	for i := range 200 {
		w.Append(rec("sb", 100+i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cutTail(t, dir, 101)
	os.WriteFile(filepath.Join(dir, HeadFile), old, 0o600)
	if rep, err := Verify(dir, VerifyOptions{PublicKey: pub}); err != nil || rep.LastSeq != 100 {
		t.Fatalf("the cut log with its old head does not verify on the host (the test cuts wrongly): %+v %v", rep, err)
	}
	ar, err := verifyAnchorsIn(t, dir, sink, pub)
	if !errors.Is(err, ErrBroken) || ar.Finding != FindingTruncated || ar.LastSeq != 300 || !strings.Contains(ar.Broken.Reason, "ends at seq 100") {
		t.Fatalf("truncated with an old head put back: %+v %v", ar, err)
	}
}

// TestAnchorsRetainedPrefix: files removed by retention are reported as such, not as
// a truncation or a rewrite; a cut tail on top of it is still caught.
func TestAnchorsRetainedPrefix(t *testing.T) {
	dir, sink, pub, _ := writeAnchored(t, 1000, Config{Retention: Retention{MaxBytes: 12 << 10}})
	ar, err := verifyAnchorsIn(t, dir, sink, pub)
	if err != nil || ar.Finding != FindingOK || ar.Retained == 0 || ar.Log.RetainedFiles == 0 || ar.Checked+ar.Retained != ar.Anchors {
		t.Fatalf("retained prefix: %+v %v", ar, err)
	}
	cutTail(t, dir, 990)
	os.Remove(filepath.Join(dir, HeadFile))
	if ar, err := verifyAnchorsIn(t, dir, sink, pub); !errors.Is(err, ErrBroken) || ar.Finding != FindingTruncated {
		t.Fatalf("retained prefix and a cut tail: %+v %v", ar, err)
	}
}

// TestAnchorsHTTPSink: anchors POSTed to an HTTP sink that refuses the first ones are
// retried (the failures counted), a restarted writer continues the sink's chain (GET
// of the last anchor), and the log verifies against what the sink received.
func TestAnchorsHTTPSink(t *testing.T) {
	var (
		mu     sync.Mutex
		stored []Anchor
		refuse = 2
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodGet {
			if len(stored) == 0 {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			json.NewEncoder(w).Encode(stored[len(stored)-1])
			return
		}
		if refuse > 0 {
			refuse--
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		var a Anchor
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		stored = append(stored, a)
	}))
	defer srv.Close()
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	for round := range 2 {
		cfg := Config{Dir: dir, MaxFileBytes: 4096, SigningKey: priv, Logger: quiet, Anchors: []AnchorSink{HTTPSink{URL: srv.URL}}}
		if round == 0 {
			cfg.Registry = reg
		}
		w := newTestWriter(t, cfg)
		t0 := time.Now()
		for i := range 100 {
			w.Append(rec("sb", round*100+i))
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("appending took %v with a refusing sink", d)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			if n := testutil.ToFloat64(w.anchorMetrics.failures.WithLabelValues("http")); n < 1 {
				t.Errorf("anchor_failures_total %v, want the refused POSTs counted", n)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	ar, err := VerifyAnchors(dir, stored, VerifyOptions{PublicKey: pub})
	if err != nil || ar.Finding != FindingOK || ar.LastSeq != 200 {
		t.Fatalf("against the HTTP sink's anchors: %+v %v", ar, err)
	}
}
