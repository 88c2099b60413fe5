package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockdev/airlock/audit/record"
)

// Filter selects records. Zero fields select everything.
type Filter struct {
	// SandboxID keeps records of one sandbox.
	SandboxID string
	// Since and Until bound the record time: Since ≤ time < Until.
	Since, Until time.Time
	// AfterSeq keeps records with seq > AfterSeq (pagination: pass the last seq seen).
	AfterSeq uint64
	// Limit caps Query's result (0: no cap).
	Limit int
	// FromStart makes Follow begin with the oldest retained record when AfterSeq is 0
	// (without it, Follow begins at the end of the log).
	FromStart bool
}

// match checks a raw line cheaply before decoding.
func (f Filter) matchLine(line []byte, needle []byte) bool {
	if f.AfterSeq > 0 && LineSeq(line) <= f.AfterSeq {
		return false
	}
	if needle != nil && !bytes.Contains(line, needle) {
		return false
	}
	if !f.Since.IsZero() || !f.Until.IsZero() {
		t := lineTime(line)
		if !f.Since.IsZero() && t.Before(f.Since) {
			return false
		}
		if !f.Until.IsZero() && !t.Before(f.Until) {
			return false
		}
	}
	return true
}

func (f Filter) needle() []byte {
	if f.SandboxID == "" {
		return nil
	}
	b, _ := json.Marshal(f.SandboxID)
	return append([]byte(`"sandbox_id":`), b...)
}

// errStop ends a scan early without error.
var errStop = errors.New("stop")

// Scan calls fn with every record in dir matching f, in seq order (f.Limit is ignored).
// Files outside f's time range are skipped using their checkpoints. Only complete lines
// are read; Scan does not verify the chain (Verify does). fn returning an error stops
// the scan with that error.
func Scan(dir string, f Filter, fn func(Record) error) error {
	files, err := logFiles(dir)
	if err != nil {
		return err
	}
	cps, _ := ReadCheckpoints(dir)
	byFile := map[string]Checkpoint{}
	for _, c := range cps {
		byFile[c.File] = c
	}
	needle := f.needle()
	for _, name := range files {
		if cp, ok := byFile[name]; ok {
			if (!f.Since.IsZero() && !cp.LastTime.IsZero() && cp.LastTime.Before(f.Since)) ||
				(!f.Until.IsZero() && !cp.FirstTime.IsZero() && !cp.FirstTime.Before(f.Until)) ||
				(f.AfterSeq > 0 && cp.LastSeq <= f.AfterSeq) {
				continue
			}
		}
		if _, err := scanFile(filepath.Join(dir, name), 0, func(line []byte) error {
			if !f.matchLine(line, needle) {
				return nil
			}
			var r Record
			if err := record.Parse(line, &r); err != nil {
				return nil // Verify reports damaged lines; readers skip them
			}
			if f.SandboxID != "" && r.SandboxID != f.SandboxID {
				return nil
			}
			return fn(r)
		}); err != nil {
			return err
		}
	}
	return nil
}

// scanFile calls fn for each complete line from offset on and returns the offset after
// the last complete line.
func scanFile(path string, offset int64, fn func(line []byte) error) (int64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return offset, err
	}
	defer fh.Close()
	if offset > 0 {
		if _, err := fh.Seek(offset, io.SeekStart); err != nil {
			return offset, err
		}
	}
	r := bufio.NewReaderSize(fh, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			offset += int64(len(line))
			if ferr := fn(line[:len(line)-1]); ferr != nil {
				return offset, ferr
			}
			continue
		}
		if err == io.EOF {
			return offset, nil
		}
		if err != nil {
			return offset, err
		}
	}
}

// Query returns the records of dir matching f in seq order, at most f.Limit. It is the
// lifecycle API's GET /v1/sandboxes/{id}/audit?since=&until= backend; more reports
// whether records beyond Limit exist (continue with AfterSeq = the last seq).
func Query(dir string, f Filter) (recs []Record, more bool, err error) {
	err = Scan(dir, f, func(r Record) error {
		if f.Limit > 0 && len(recs) == f.Limit {
			more = true
			return errStop
		}
		recs = append(recs, r)
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return recs, more, err
}

// Tail returns the last n records matching f (f.Limit is ignored), oldest first.
func Tail(dir string, n int, f Filter) ([]Record, error) {
	if n <= 0 {
		return nil, nil
	}
	ring := make([]Record, 0, n)
	start := 0
	err := Scan(dir, f, func(r Record) error {
		if len(ring) < n {
			ring = append(ring, r)
		} else {
			ring[start] = r
			start = (start + 1) % n
		}
		return nil
	})
	return append(ring[start:], ring[:start]...), err
}

// Follow calls fn with every record matching f appended to dir after the call (and,
// with f.AfterSeq set, every record after that seq), following rotation, until ctx ends
// or fn fails. It polls every poll interval (default 200ms). ctx's end returns nil.
func Follow(ctx context.Context, dir string, f Filter, poll time.Duration, fn func(Record) error) error {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	fl, err := NewFollower(dir, f)
	if err != nil {
		return err
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		if err := fl.Read(fn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Follower reads the records appended to a log round by round (Read), following rotation:
// what Follow polls with, for a reader that decides itself when to read (the OTLP
// export waits while the writer is busy).
type Follower struct {
	dir    string
	f      Filter
	needle []byte
	cur    string // the file being read
	off    int64  // after its last complete line read
}

// NewFollower positions a Follower as Follow starts: after the last complete record when
// f.AfterSeq is 0 and f.FromStart is not set, else at the oldest retained record (the
// records up to f.AfterSeq are skipped).
func NewFollower(dir string, f Filter) (*Follower, error) {
	t := &Follower{dir: dir, f: f, needle: f.needle()}
	if f.AfterSeq == 0 && !f.FromStart { // start at the end
		files, err := logFiles(dir)
		if err != nil {
			return nil, err
		}
		if len(files) > 0 {
			t.cur = files[len(files)-1]
			t.off, _ = scanFile(filepath.Join(dir, t.cur), 0, func([]byte) error { return nil })
		}
	}
	return t, nil
}

// Read calls fn with each record matching the filter written since the previous Read
// (complete lines only), in seq order. An error of fn stops the round and is returned.
func (t *Follower) Read(fn func(Record) error) error {
	files, err := logFiles(t.dir)
	if err != nil {
		return err
	}
	for _, name := range files {
		if name < t.cur {
			continue
		}
		if name > t.cur {
			t.cur, t.off = name, 0
		}
		t.off, err = scanFile(filepath.Join(t.dir, name), t.off, func(line []byte) error {
			if !t.f.matchLine(line, t.needle) {
				return nil
			}
			var r Record
			if record.Parse(line, &r) != nil || (t.f.SandboxID != "" && r.SandboxID != t.f.SandboxID) {
				return nil
			}
			return fn(r)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
