package ocsf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// DirName is the directory of the OCSF files inside the audit directory.
const DirName = "ocsf"

// Config configures an Exporter.
type Config struct {
	// ChainDir is the audit log's directory (audit.Config.Dir); the events go to
	// ChainDir/ocsf (created 0700).
	ChainDir string
	// Host is this machine's name for events about Airlock itself; default
	// os.Hostname.
	Host string
	// Queue is how many written batches may wait for the exporter; default 256. A
	// batch that finds it full is not lost: the exporter reads those records back
	// from the chain files.
	Queue int
	// SyncInterval is how often the current file is fsync'd; default 1s.
	SyncInterval time.Duration
	// Logger receives errors; default slog.Default().
	Logger *slog.Logger
}

// Exporter is an audit.Sink that writes the OCSF events of every record (Mapper) as
// JSON Lines beside the chain: ChainDir/ocsf/audit-<first seq>.ocsf.jsonl, one file
// per chain file (rotated with it), removed once its chain file is gone (the chain's
// retention). It works on its own goroutine, fed through a bounded queue, so the
// chain writer never waits for it; a batch that finds the queue full is read back from
// the chain files later, so no record is missing from the export either. On start it
// continues its file after the last event it finds there (a torn line is cut off) and
// reads what it missed from the chain; a chain file without OCSF file (the export just
// turned on) is exported from its first record.
type Exporter struct {
	cfg  Config
	dir  string
	log  *slog.Logger
	m    Mapper
	ch   chan batch
	done chan struct{}
	gap  atomic.Bool   // a batch was dropped: catch up from the chain
	last atomic.Uint64 // seq of the last exported record

	// owned by the run goroutine
	f      *os.File
	name   string // chain file of f
	next   uint64 // next seq to export; 0: not known yet
	buf    []byte
	dirty  bool
	closed bool
}

type batch struct {
	file string
	recs []audit.Record
}

var _ audit.Sink = (*Exporter)(nil)

// New creates ChainDir/ocsf and starts the exporter; pass it as audit.Config.Sink
// (the writer closes it).
func New(cfg Config) (*Exporter, error) {
	if cfg.ChainDir == "" {
		return nil, errors.New("ocsf: Config.ChainDir is empty")
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 256
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dir := filepath.Join(cfg.ChainDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ocsf: %w", err)
	}
	e := &Exporter{cfg: cfg, dir: dir, log: cfg.Logger, m: Mapper{Host: cfg.Host}, ch: make(chan batch, cfg.Queue),
		done: make(chan struct{})}
	go e.run()
	return e, nil
}

// Written copies recs for the exporter's goroutine; when its queue is full the batch
// is dropped and read back from the chain files later. Called by the audit writer.
func (e *Exporter) Written(file string, recs []audit.Record) {
	b := batch{file: file, recs: append([]audit.Record(nil), recs...)}
	select {
	case e.ch <- b:
	default:
		e.gap.Store(true)
	}
}

// Close exports what is queued (and what was dropped), fsyncs and closes the file.
// Called once by the audit writer after its last Written.
func (e *Exporter) Close() error {
	close(e.ch)
	<-e.done
	return nil
}

// Exported is the seq of the last record whose events were written.
func (e *Exporter) Exported() uint64 { return e.last.Load() }

// Dir is the directory of the OCSF files.
func (e *Exporter) Dir() string { return e.dir }

func (e *Exporter) run() {
	defer close(e.done)
	tick := time.NewTicker(e.cfg.SyncInterval)
	defer tick.Stop()
	prune := time.Now()
	for {
		select {
		case b, ok := <-e.ch:
			if !ok {
				if e.gap.Load() && e.next != 0 {
					e.readChain(e.next, 0) // the batches a full queue dropped at the end
				}
				e.flush()
				e.closeFile()
				return
			}
			if len(b.recs) == 0 {
				continue
			}
			for i := range b.recs {
				e.emit(b.file, &b.recs[i])
			}
			e.flush()
		case now := <-tick.C:
			e.sync()
			if now.Sub(prune) >= time.Minute {
				prune = now
				e.prune()
			}
		}
	}
}

// emit appends the events of r, written to the chain file file, switching files when
// the chain did. Records the exporter has not seen (a dropped batch, a restart, a new
// export) are read from the chain first.
func (e *Exporter) emit(file string, r *audit.Record) {
	if e.next != 0 && r.Seq > e.next {
		e.readChain(e.next, r.Seq)
	}
	if file != e.name {
		e.flush()
		e.open(file)
		switch {
		case e.next == 0: // a new export: the chain file from its start
			e.readChain(max(fileFirst(file), 1), r.Seq)
		case r.Seq > e.next: // restarted behind the chain
			e.readChain(e.next, r.Seq)
		}
		if file != e.name {
			e.flush()
			e.open(file)
		}
	}
	if e.next != 0 && r.Seq < e.next {
		return // exported before a restart
	}
	e.buf = e.m.Append(e.buf, r)
	e.next = r.Seq + 1
	if len(e.buf) >= 1<<20 {
		e.flush()
	}
}

// readChain exports the chain's records with from ≤ seq < to (to 0: no end).
func (e *Exporter) readChain(from, to uint64) {
	files := chainFiles(e.cfg.ChainDir)
	stop := errors.New("stop")
	err := audit.Scan(e.cfg.ChainDir, audit.Filter{AfterSeq: from - 1}, func(r audit.Record) error {
		if to != 0 && r.Seq >= to {
			return stop
		}
		file := fileOf(files, r.Seq)
		if file != e.name {
			e.flush()
			e.open(file)
		}
		if r.Seq >= e.next || e.next == 0 {
			e.buf = e.m.Append(e.buf, &r)
			e.next = r.Seq + 1
		}
		if len(e.buf) >= 1<<20 {
			e.flush()
		}
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		e.log.Warn("ocsf export: read the chain", "from_seq", from, "err", err)
	}
}

// open makes the OCSF file of the chain file file current, continuing it after its
// last complete line.
func (e *Exporter) open(file string) {
	e.closeFile()
	e.prune()
	e.name = file
	path := filepath.Join(e.dir, ocsfName(file))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		e.log.Error("ocsf export: open", "file", path, "err", err)
		return
	}
	seq, size, err := lastSeq(f)
	if err == nil {
		err = f.Truncate(size)
	}
	if err == nil {
		_, err = f.Seek(size, io.SeekStart)
	}
	if err != nil {
		e.log.Error("ocsf export: recover", "file", path, "err", err)
	}
	if seq > 0 {
		e.next = seq + 1
	}
	e.f = f
}

func (e *Exporter) flush() {
	if len(e.buf) == 0 {
		return
	}
	if e.f == nil {
		e.log.Warn("ocsf export: no file, events dropped", "bytes", len(e.buf))
	} else if _, err := e.f.Write(e.buf); err != nil {
		e.log.Error("ocsf export: write", "file", e.f.Name(), "err", err)
	} else {
		e.dirty = true
		e.last.Store(e.next - 1)
	}
	e.buf = e.buf[:0]
}

func (e *Exporter) sync() {
	if e.f != nil && e.dirty {
		if err := e.f.Sync(); err != nil {
			e.log.Warn("ocsf export: fsync", "err", err)
		}
		e.dirty = false
	}
}

func (e *Exporter) closeFile() {
	if e.f == nil {
		return
	}
	e.sync()
	if err := e.f.Close(); err != nil {
		e.log.Warn("ocsf export: close", "err", err)
	}
	e.f = nil
}

// prune removes the OCSF files whose chain file is gone (the chain's retention).
func (e *Exporter) prune() {
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		return
	}
	for _, ent := range ents {
		chain, ok := strings.CutSuffix(ent.Name(), ".ocsf.jsonl")
		if !ok || chain+".jsonl" == e.name {
			continue
		}
		if _, err := os.Stat(filepath.Join(e.cfg.ChainDir, chain+".jsonl")); errors.Is(err, os.ErrNotExist) {
			if err := os.Remove(filepath.Join(e.dir, ent.Name())); err == nil {
				e.log.Info("ocsf file retained away with its chain file", "file", ent.Name())
			}
		}
	}
}

// ocsfName is the OCSF file of a chain file: audit-<seq>.ocsf.jsonl.
func ocsfName(chain string) string { return strings.TrimSuffix(chain, ".jsonl") + ".ocsf.jsonl" }

// fileFirst is the first seq of a chain file by its name; 0 when not one.
func fileFirst(name string) uint64 {
	s, ok := strings.CutPrefix(name, "audit-")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSuffix(s, ".jsonl"), 10, 64)
	return n
}

// chainFiles are the chain's files in seq order.
func chainFiles(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, ent := range ents {
		if fileFirst(ent.Name()) > 0 && strings.HasSuffix(ent.Name(), ".jsonl") {
			out = append(out, ent.Name())
		}
	}
	sort.Slice(out, func(i, j int) bool { return fileFirst(out[i]) < fileFirst(out[j]) })
	return out
}

// fileOf is the chain file holding seq.
func fileOf(files []string, seq uint64) string {
	name := ""
	for _, f := range files {
		if fileFirst(f) > seq {
			break
		}
		name = f
	}
	return name
}

// lastSeq reads the end of an OCSF file: the chain seq of its last complete event
// (0 when none) and the size up to that line's end.
func lastSeq(f *os.File) (uint64, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := st.Size()
	off := max(size-1<<20, 0)
	b := make([]byte, size-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return 0, size, err
	}
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return 0, off, nil
	}
	line := b[:end]
	line = line[bytes.LastIndexByte(line, '\n')+1:]
	const key = `"original_event_uid":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0, off + int64(end) + 1, nil
	}
	v := line[i+len(key):]
	n, _ := strconv.ParseUint(string(v[:max(bytes.IndexByte(v, '"'), 0)]), 10, 64)
	return n, off + int64(end) + 1, nil
}
