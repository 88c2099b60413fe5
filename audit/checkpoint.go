package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// CheckpointFile is the name of the checkpoint log inside the audit directory.
const CheckpointFile = "checkpoints.jsonl"

// Checkpoint seals one finished (rotated) log file. Checkpoints form their own chain:
// Hash = hex(SHA-256(canonical JSON of the checkpoint without hash and sig)), which
// includes Prev, the previous checkpoint's Hash (Genesis for the first). Sig, when the
// writer has a signing key, is base64(Ed25519 signature over the raw Hash bytes).
type Checkpoint struct {
	File       string    `json:"file"`
	FirstSeq   uint64    `json:"first_seq"`
	LastSeq    uint64    `json:"last_seq"`
	FirstTime  time.Time `json:"first_time,omitzero"`
	LastTime   time.Time `json:"last_time,omitzero"`
	LastHash   string    `json:"last_hash"`
	FileSHA256 string    `json:"file_sha256"`
	Time       time.Time `json:"time"`
	Prev       string    `json:"prev"`
	// Head is set by writers that keep a signed head (HeadFile): once a checkpoint
	// says so, Verify treats a missing head as a break.
	Head bool   `json:"head,omitempty"`
	Hash string `json:"hash,omitempty"`
	Sig  string `json:"sig,omitempty"`
}

func (c Checkpoint) computeHash() string {
	c.Hash, c.Sig = "", ""
	return jsonDigest(c)
}

// appendCheckpoint chains cp to the last checkpoint, signs it, appends it to the
// checkpoint file and fsyncs.
func (w *Writer) appendCheckpoint(cp *Checkpoint) error {
	cp.Time = time.Now().UTC().Truncate(time.Microsecond)
	cp.FirstTime = cp.FirstTime.UTC().Truncate(time.Microsecond)
	cp.LastTime = cp.LastTime.UTC().Truncate(time.Microsecond)
	cp.Prev = w.checkpoint
	if cp.Prev == "" {
		cp.Prev = Genesis
	}
	cp.Head = true
	cp.Hash = cp.computeHash()
	cp.Sig = signDigest(w.cfg.SigningKey, cp.Hash)
	if err := appendJSONLine(filepath.Join(w.cfg.Dir, CheckpointFile), cp); err != nil {
		return fmt.Errorf("audit: checkpoint: %w", err)
	}
	w.checkpoint = cp.Hash
	w.anchor(checkpointAnchor(*cp))
	return nil
}

// ReadCheckpoints returns the checkpoints in dir in order; a torn last line is ignored.
func ReadCheckpoints(dir string) ([]Checkpoint, error) {
	return readJSONLines[Checkpoint](dir, CheckpointFile)
}

// logFiles lists the log files in dir in seq order.
func logFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "audit-") && strings.HasSuffix(n, ".jsonl") && !e.IsDir() {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// recover restores the chain state from dir: the last record's seq and hash (cutting a
// torn last line off), the last checkpoint's hash, and missing checkpoints of finished
// files (a crash between rotation steps). It leaves the current file open for append.
func (w *Writer) recover() error {
	prev, err := w.recoverTail()
	if err != nil {
		return err
	}
	if w.prev, err = parseHash(prev); err != nil {
		return fmt.Errorf("audit: the chain's last hash %.64q is not 64 hex digits; run `airlock audit verify`", prev)
	}
	return nil
}

// recoverTail is recover's work; it returns the last record's hash (Genesis when none).
func (w *Writer) recoverTail() (prev string, err error) {
	prev = Genesis
	cps, err := ReadCheckpoints(w.cfg.Dir)
	if err != nil {
		return prev, err
	}
	have := map[string]Checkpoint{}
	for _, c := range cps {
		have[c.File] = c
		w.checkpoint = c.Hash
	}
	files, err := logFiles(w.cfg.Dir)
	if err != nil {
		return prev, fmt.Errorf("audit: %w", err)
	}
	if len(files) == 0 {
		return prev, w.openFile(1)
	}
	for i, name := range files {
		last := i == len(files)-1
		if cp, ok := have[name]; ok {
			w.seq, prev = cp.LastSeq, cp.LastHash // sealed: no need to read it
			if last {                             // crashed between the checkpoint and the next file
				return prev, w.openFile(w.seq + 1)
			}
			continue
		}
		st, err := w.scanTail(name, last)
		if err != nil {
			return prev, err
		}
		if st.records > 0 {
			w.seq, prev = st.lastSeq, st.lastHash
		}
		if last {
			f, err := os.OpenFile(filepath.Join(w.cfg.Dir, name), os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return prev, fmt.Errorf("audit: %w", err)
			}
			w.f, w.name, w.size, w.fileHash, w.fileFirst = f, name, st.size, st.hash, st.firstSeq
			w.firstTime, w.lastTime = st.firstTime, st.lastTime
			if st.records == 0 {
				w.fileFirst = w.seq + 1
			}
			return prev, nil
		}
		if st.records > 0 {
			cp := Checkpoint{File: name, FirstSeq: st.firstSeq, LastSeq: st.lastSeq, FirstTime: st.firstTime,
				LastTime: st.lastTime, LastHash: st.lastHash, FileSHA256: hex.EncodeToString(st.hash.Sum(nil))}
			if err := w.appendCheckpoint(&cp); err != nil {
				return prev, err
			}
			w.log.Warn("audit checkpoint written on recovery", "file", name)
		}
	}
	return prev, nil
}

type fileState struct {
	records             int
	firstSeq, lastSeq   uint64
	firstTime, lastTime time.Time
	lastHash            string
	size                int64
	hash                hash.Hash
}

// scanTail reads a log file, hashing it and finding its first and last records. In the
// current (last) file a torn final line is truncated away.
func (w *Writer) scanTail(name string, current bool) (*fileState, error) {
	path := filepath.Join(w.cfg.Dir, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st := &fileState{}
	h := sha256.New()
	st.hash = h
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			h.Write(line)
			st.size += int64(len(line))
			body := line[:len(line)-1]
			_, _, hash, ok := lineParts(body)
			if !ok {
				return nil, fmt.Errorf("audit: %s: line %d is not a chained record; run `airlock audit verify`", name, st.records+1)
			}
			seq, t := LineSeq(body), lineTime(body)
			if st.records == 0 {
				st.firstSeq, st.firstTime = seq, t
			}
			st.records++
			st.lastSeq, st.lastHash, st.lastTime = seq, hash, t
			continue
		}
		if err == io.EOF {
			if len(line) > 0 {
				if !current {
					return nil, fmt.Errorf("audit: %s ends with a torn line; run `airlock audit verify`", name)
				}
				if terr := os.Truncate(path, st.size); terr != nil {
					return nil, fmt.Errorf("audit: cut torn tail of %s: %w", name, terr)
				}
				w.log.Warn("audit torn tail cut after crash", "file", name, "bytes", len(line))
				w.metrics.tornTails.Inc()
			}
			return st, nil
		}
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
}
