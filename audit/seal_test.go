package audit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// referenceLine is a log line as the writer sealed it before sealer: the canonical
// bytes, ChainHash, then prev and hash appended.
func referenceLine(r Record, prev string) (line []byte, hash string, err error) {
	c, err := r.Canonical()
	if err != nil {
		return nil, "", err
	}
	if hash, err = ChainHash(prev, c); err != nil {
		return nil, "", err
	}
	line = append(c[:len(c)-1], `,"prev":"`+prev+`","hash":"`+hash+`"}`+"\n"...)
	return line, hash, nil
}

// TestSealMatchesReference: sealed lines are the lines the writer sealed with
// Canonical and ChainHash (package record proves the canonical bytes against
// encoding/json), a record whose Extra cannot be encoded fails with encoding/json's
// error and leaves the buffer and the chain as they were, and MarshalJSON of a sealed
// record is its log line.
func TestSealMatchesReference(t *testing.T) {
	recs := benchRecords(64)
	recs = append(recs,
		Record{},
		Record{Time: time.Unix(0, 1500), Seq: 7, Source: SourceDNS, DstHost: "a\"b\\c<d>\u2028", Action: "deny",
			Extra: map[string]any{"z": nil, "n": []any{1.5, "x"}, "m": map[string]any{"k": true}}},
		Record{Action: "allow", Extra: map[string]any{"bad": math.NaN()}},
		Record{Action: "allow", Extra: map[string]any{"bad": func() {}}},
	)
	var s sealer
	prev := Genesis
	for i, r := range recs {
		wantLine, hash, werr := referenceLine(r, prev)
		before := s.prev
		line, err := s.seal([]byte("x"), &r)
		if werr != nil {
			if err == nil || err.Error() != werr.Error() || string(line) != "x" || s.prev != before {
				t.Fatalf("record %d: seal = %q, %v; want the buffer and chain unchanged and %v", i, line, err, werr)
			}
			continue
		}
		if err != nil || !bytes.Equal(line[1:], wantLine) {
			t.Fatalf("record %d: sealed line (err %v)\n%s\nwant\n%s", i, err, line[1:], wantLine)
		}
		if got := hex.EncodeToString(s.prev[:]); got != hash {
			t.Fatalf("record %d: sealer at %s after sealing, want %s", i, got, hash)
		}
		var back Record
		if err := json.Unmarshal(line[1:], &back); err != nil {
			t.Fatal(err)
		}
		if j, err := back.MarshalJSON(); err != nil || !bytes.Equal(append(j, '\n'), wantLine) {
			t.Fatalf("record %d: MarshalJSON of the record read back = %s, %v\nwant %s", i, j, err, wantLine)
		}
		prev = hash
	}
}

// TestSealAllocs: sealing the data path's records (DNS answers, gateway requests) into a
// buffer with room allocates nothing, and writeBatch allocates nothing per batch.
func TestSealAllocs(t *testing.T) {
	recs := benchRecords(64)
	var s sealer
	buf := make([]byte, 0, 1<<16)
	n := testing.AllocsPerRun(100, func() {
		buf = buf[:0]
		for i := range recs {
			var err error
			if buf, err = s.seal(buf, &recs[i]); err != nil {
				t.Fatal(err)
			}
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per %d sealed records, want 0", n, len(recs))
	}

	w, err := open(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.f.Close()
	batch := make([]Record, len(recs))
	w.writeBatch(recs) // grows w.buf and w.sources
	n = testing.AllocsPerRun(20, func() {
		copy(batch, recs)
		w.writeBatch(batch)
	})
	if n != 0 {
		t.Errorf("%v allocations per writeBatch of %d records, want 0", n, len(recs))
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(w.cfg.Dir, VerifyOptions{}); err != nil {
		t.Errorf("log written by writeBatch does not verify: %v", err)
	}
}
