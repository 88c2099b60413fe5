package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newTestWriter(t *testing.T, cfg Config) *Writer {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func rec(sandbox string, i int) Record {
	return Record{SandboxID: sandbox, Source: SourceDNS, Proto: "udp", Src: "10.88.0.5:40000",
		DstHost: fmt.Sprintf("host%d.example.com", i), QType: "A", Action: "allow", Mode: "enforce",
		Rule: "egress[0]", Reason: "allow *.example.com", PolicyVersion: 3}
}

func TestRecordLineFormat(t *testing.T) {
	r := Record{Time: time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("x", 3600)), Seq: 9,
		SandboxID: "sb1", Source: SourceBPF, DstIP: "198.51.100.7", DstPort: 443, Action: "deny",
		Extra: map[string]any{"b": 1, "a": "x"}}
	var s sealer // at Genesis
	line, err := s.seal(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	r.Prev, r.Hash = Genesis, hex.EncodeToString(s.prev[:])
	want := `{"time":"2026-03-04T04:06:07.123456Z","seq":9,"sandbox_id":"sb1","source":"bpf","dst_ip":"198.51.100.7","dst_port":443,"action":"deny","extra":{"a":"x","b":1},"prev":"` + Genesis + `","hash":"` + r.Hash + "\"}\n"
	if string(line) != want {
		t.Errorf("line\n%s\nwant\n%s", line, want)
	}
	b, _ := r.MarshalJSON()
	if string(b)+"\n" != want {
		t.Errorf("MarshalJSON differs from the log line:\n%s", b)
	}
	c, p, h, ok := lineParts(bytes.TrimSuffix(line, []byte("\n")))
	if !ok || p != Genesis || h != r.Hash {
		t.Fatalf("lineParts = %q %q %v", p, h, ok)
	}
	if got, _ := ChainHash(p, c); got != r.Hash {
		t.Errorf("rehash = %s, want %s", got, r.Hash)
	}
}

// TestMillionRecordsConcurrentTamper writes 1,000,000 records from concurrent writers
// (with rotation; most through TryAppend with retry, every 10th through the data path's
// Append, which may lose), verifies the chain and the exact accounting of losses, then
// flips one byte and expects Verify to name the record.
func TestMillionRecordsConcurrentTamper(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const total, writers = 1_000_000, 8
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 64 << 20, QueueSize: 1 << 16})
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range total / writers {
				r := rec(fmt.Sprintf("sb-%d", g), i)
				if i%10 == 0 {
					w.Append(r)
					continue
				}
				for !w.TryAppend(r) {
					time.Sleep(100 * time.Microsecond)
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lossRecords uint64
	if err := Scan(dir, Filter{}, func(r Record) error {
		if r.Action == "loss" {
			lossRecords++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	written := rep.Records - lossRecords
	if written+rep.Lost != total {
		t.Fatalf("records %d + lost %d != %d appended: a loss went unrecorded", written, rep.Lost, total)
	}
	if rep.Files < 3 || rep.Checkpoints != rep.Files-1 {
		t.Errorf("files=%d checkpoints=%d: rotation did not happen as expected", rep.Files, rep.Checkpoints)
	}
	if written < total*9/10 {
		t.Errorf("only %d of %d records written", written, total)
	}
	t.Logf("verified %d records in %d files, %d lost", rep.Records, rep.Files, rep.Lost)

	// Tamper: flip one byte inside a record in the middle of the second file.
	files, _ := logFiles(dir)
	path := filepath.Join(dir, files[1])
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	target := len(lines) / 2
	off := 0
	for _, l := range lines[:target] {
		off += len(l)
	}
	i := off + bytes.Index(lines[target], []byte("host")) + 4 // a digit of dst_host
	data[i] ^= 0x01
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err = Verify(dir, VerifyOptions{})
	if !errors.Is(err, ErrBroken) || rep.Broken == nil {
		t.Fatalf("Verify after tampering = %v", err)
	}
	if rep.Broken.File != files[1] || rep.Broken.Line != target+1 || !strings.Contains(rep.Broken.Reason, "altered") {
		t.Errorf("break at %s line %d (%s); want %s line %d", rep.Broken.File, rep.Broken.Line, rep.Broken.Reason, files[1], target+1)
	}
}

// TestLossIsRecorded fills the queue before the writer runs: the overflow must appear
// as a loss record with the exact count.
func TestLossIsRecorded(t *testing.T) {
	dir := t.TempDir()
	w, err := open(Config{Dir: dir, QueueSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		w.Append(rec("sb", i))
	}
	w.Append(Record{Source: SourceGateway, Action: "allow"})
	go w.run()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w.Append(rec("sb", 99)) // after Close: counted, never written
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lost != 8 || rep.Records != 5 {
		t.Fatalf("records=%d lost=%d, want 3 records + 2 loss records (dns, gateway), lost 8", rep.Records, rep.Lost)
	}
	recs, _, _ := Query(dir, Filter{})
	perSource := map[Source]float64{}
	for _, r := range recs[3:] {
		if r.Action != "loss" {
			t.Fatalf("record %+v is not a loss record", r)
		}
		perSource[r.Source] = r.Extra["lost"].(float64)
	}
	if perSource[SourceDNS] != 7 || perSource[SourceGateway] != 1 {
		t.Errorf("loss per source = %v", perSource)
	}
}

func TestRotationCheckpointsSigned(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 4096, SigningKey: priv})
	for i := range 200 {
		w.Append(rec("sb", i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, VerifyOptions{PublicKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Checkpoints < 5 || rep.Records != 200 || rep.VerifiedSignatures != rep.Checkpoints {
		t.Fatalf("report %+v", rep)
	}
	if rep, _ := Verify(dir, VerifyOptions{}); rep.UnverifiedSignatures != rep.Checkpoints {
		t.Errorf("unverified = %d", rep.UnverifiedSignatures)
	}
	other, _, _ := ed25519.GenerateKey(nil)
	if _, err := Verify(dir, VerifyOptions{PublicKey: other}); !errors.Is(err, ErrBroken) {
		t.Errorf("wrong key verified: %v", err)
	}
	// Removing a whole record from a finished file breaks the file's checkpoint or the
	// chain, even though the file's own lines still chain.
	files, _ := logFiles(dir)
	p := filepath.Join(dir, files[0])
	data, _ := os.ReadFile(p)
	lines := bytes.SplitAfter(data, []byte("\n"))
	cut := bytes.Join(lines[:len(lines)-2], nil)
	os.WriteFile(p, cut, 0o600)
	rep, err = Verify(dir, VerifyOptions{PublicKey: pub})
	if !errors.Is(err, ErrBroken) || rep.Broken.File != files[0] {
		t.Errorf("Verify after cutting the last record of %s = %v %+v", files[0], err, rep.Broken)
	}
}

func TestReopenContinuesChain(t *testing.T) {
	dir := t.TempDir()
	for round := range 3 {
		w, err := New(Config{Dir: dir, MaxFileBytes: 2048})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			w.Append(rec("sb", round*100+i))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// a torn tail, as a crash mid-write leaves it
	files, _ := logFiles(dir)
	f, _ := os.OpenFile(filepath.Join(dir, files[len(files)-1]), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"time":"2026-01-01T00:00:00.000000Z","seq":61,"sour`)
	f.Close()
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil || rep.TornTail == nil || rep.LastSeq != 60 {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
	w, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(rec("sb", 1000))
	w.Close()
	rep, err = Verify(dir, VerifyOptions{})
	if err != nil || rep.TornTail != nil || rep.LastSeq != 61 {
		t.Fatalf("after reopen Verify = %+v, %v", rep, err)
	}
}

// TestReopenRefusesMalformedLastHash: a last line whose hash is not hex (the tail's
// shape intact) cannot be chained to; New says so instead of losing every record.
func TestReopenRefusesMalformedLastHash(t *testing.T) {
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir})
	for i := range 3 {
		w.Append(rec("sb", i))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := logFiles(dir)
	path := filepath.Join(dir, files[0])
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hashAt := len(data) - len("\"}\n") - 64
	copy(data[hashAt:], strings.Repeat("z", 64))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if w, err := New(Config{Dir: dir}); err == nil || !strings.Contains(err.Error(), "airlock audit verify") {
		if w != nil {
			w.Close()
		}
		t.Fatalf("New over a malformed last hash: %v", err)
	}
}

func TestQueryTailFollow(t *testing.T) {
	dir := t.TempDir()
	w := newTestWriter(t, Config{Dir: dir, MaxFileBytes: 1500, SyncInterval: 10 * time.Millisecond})
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 40 {
		r := rec([]string{"a", "b"}[i%2], i)
		r.Time = base.Add(time.Duration(i) * time.Second)
		w.Append(r)
	}
	waitFor(t, func() bool { return w.Written() == 40 })

	got, more, err := Query(dir, Filter{SandboxID: "a", Since: base.Add(10 * time.Second), Until: base.Add(20 * time.Second)})
	if err != nil || more || len(got) != 5 || got[0].DstHost != "host10.example.com" || got[4].DstHost != "host18.example.com" {
		t.Fatalf("Query = %d records, more=%t, %v", len(got), more, err)
	}
	page, more, _ := Query(dir, Filter{SandboxID: "b", Limit: 3})
	if len(page) != 3 || !more {
		t.Fatalf("page = %d more=%t", len(page), more)
	}
	next, _, _ := Query(dir, Filter{SandboxID: "b", Limit: 3, AfterSeq: page[2].Seq})
	if len(next) != 3 || next[0].Seq <= page[2].Seq {
		t.Fatalf("next page starts at %d after %d", next[0].Seq, page[2].Seq)
	}
	tail, err := Tail(dir, 3, Filter{SandboxID: "a"})
	if err != nil || len(tail) != 3 || tail[2].DstHost != "host38.example.com" {
		t.Fatalf("Tail = %+v %v", tail, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan Record, 100)
	started := make(chan struct{})
	go func() {
		close(started)
		Follow(ctx, dir, Filter{SandboxID: "b"}, 5*time.Millisecond, func(r Record) error { seen <- r; return nil })
	}()
	<-started
	time.Sleep(50 * time.Millisecond) // Follow starts at the end: let it find the end first
	for i := 100; i < 130; i++ {
		w.Append(rec([]string{"a", "b"}[i%2], i)) // crosses several rotations
	}
	for want := 101; want < 130; want += 2 {
		select {
		case r := <-seen:
			if r.DstHost != fmt.Sprintf("host%d.example.com", want) {
				t.Fatalf("Follow delivered %s, want host%d", r.DstHost, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Follow did not deliver host%d", want)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReopenAfterCheckpointBeforeNextFile: a crash right after a rotation checkpoint
// leaves the sealed file last; the writer must start a new file, not append to it.
func TestReopenAfterCheckpointBeforeNextFile(t *testing.T) {
	dir := t.TempDir()
	w, err := New(Config{Dir: dir, MaxFileBytes: 1500})
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for i := 0; ; i++ { // write until a rotation has just opened an empty file
		w.Append(rec("sb", i))
		waitFor(t, func() bool { return w.Written() == uint64(i+1) })
		files, _ := logFiles(dir)
		last = files[len(files)-1]
		if st, _ := os.Stat(filepath.Join(dir, last)); len(files) > 1 && st.Size() == 0 {
			break
		}
	}
	w.Close()
	os.Remove(filepath.Join(dir, last)) // as if the crash came before the new file
	want := lastSeq(t, dir)
	w, err = New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(rec("sb", 99))
	w.Close()
	if rep, err := Verify(dir); err != nil || rep.LastSeq != want+1 {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
}

// lastSeq returns the last seq in dir.
func lastSeq(t *testing.T, dir string) uint64 {
	t.Helper()
	rep, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rep.LastSeq
}

// roomSink is a RecordSink with a fixed room that keeps what it is handed.
type roomSink struct {
	room int
	mu   sync.Mutex
	got  []WrittenBatch
}

func (s *roomSink) Written(string, uint64) {}
func (s *roomSink) Close() error           { return nil }
func (s *roomSink) Room() int              { return s.room }
func (s *roomSink) Records(b WrittenBatch) {
	s.mu.Lock()
	s.got = append(s.got, b)
	s.mu.Unlock()
}

// TestWriterHandsOverWhatFits: a write whose records do not fit the sink's room is
// not handed over (no record of it is copied for the sink); one that fits is, whole,
// with its hashes.
func TestWriterHandsOverWhatFits(t *testing.T) {
	for _, tc := range []struct {
		room, want int
	}{{5, 0}, {100, 20}} {
		sink := &roomSink{room: tc.room}
		w, err := New(Config{Dir: t.TempDir(), Sink: sink, Linger: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 { // one write: the first record's linger takes the others
			w.Append(rec("sb", i))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, b := range sink.got {
			if len(b.Hashes) != len(b.Recs) {
				t.Fatalf("room %d: a batch of %d records with %d hashes", tc.room, len(b.Recs), len(b.Hashes))
			}
			n += len(b.Recs)
		}
		if n != tc.want {
			t.Errorf("room %d: %d records handed over in %d batches, want %d", tc.room, n, len(sink.got), tc.want)
		}
	}
}
