package ocsf

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/record"
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
	// Quiet and MaxLag make the export yield to the chain: the exporter reads the
	// chain once the writer has written nothing for Quiet (default 250ms, longer than
	// an fsync of the chain) or the oldest record not exported has waited MaxLag
	// (default 2s), so a burst is written to the chain at full speed and exported
	// right after it, and a sustained stream is exported at most MaxLag late.
	Quiet, MaxLag time.Duration
	// ExportHeld records held start the export of a stream too, quiet or not, so that
	// a stream faster than MaxHeld per MaxLag is exported from memory, not read back
	// from the chain. A stream is what the writer writes in batches smaller than
	// streamBatch (it waits for records); a burst, written in larger batches, still
	// waits for Quiet or MaxLag. Default MaxHeld/2; negative: only Quiet and MaxLag
	// start the export.
	ExportHeld int
	// SyncInterval is how often the current file is fsync'd; default 1s.
	SyncInterval time.Duration
	// MaxHeld is how many of the records the writer hands over (audit.RecordSink) the
	// exporter keeps in memory until it exports them, so that it need not read them
	// back from the chain; what does not fit is read from the chain. Default 8192;
	// negative: none (every record is read from the chain).
	MaxHeld int
	// Logger receives errors; default slog.Default().
	Logger *slog.Logger
}

// Exporter is an audit.Sink that writes the OCSF events of every record (Mapper) as
// JSON Lines beside the chain: ChainDir/ocsf/audit-<first seq>.ocsf.jsonl, one file
// per chain file (rotated with it), removed once its chain file is gone (the chain's
// retention). The writer tells it how far the chain is written and hands it the
// written records (audit.RecordSink); the exporter, on its own goroutine, converts
// them, yielding to the writer (Config.Quiet, MaxLag). It keeps at most MaxHeld
// records: one it did not keep it reads back from the chain files (from where it left
// off), so nothing can be dropped: every record in the chain is exported, and a kept
// record is converted as it reads back from the chain (record.ReadBack), so the events
// are the same either way. On start it continues its file after the last event it
// finds there (a torn line is cut off) and reads what it missed from the chain; a
// chain file without OCSF file (the export just turned on) is exported from its first
// record.
type Exporter struct {
	cfg  Config
	dir  string
	log  *slog.Logger
	m    Mapper
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	target    atomic.Uint64 // the chain's last written seq
	lastWrite atomic.Int64  // when the writer last wrote, unix ns
	last      atomic.Uint64 // seq of the last exported record

	heldMu    sync.Mutex
	held      []audit.WrittenBatch // handed by the writer, not exported yet, in seq order
	heldN     int                  // records in held
	streaming bool                 // the last batch handed over was a stream's (streamBatch)
	// records exported as handed over and as read from the chain
	fromHeld, fromChain atomic.Uint64

	// owned by the run goroutine
	f      *os.File // the OCSF file
	name   string   // chain file of f
	next   uint64   // next seq to export; 0: not known yet
	buf    []byte
	dirty  bool
	src    *os.File // the chain file being read
	srcOff int64
	rbuf   []byte
	hexBuf []byte // fromMemory's hex of a batch's hashes
	// the chain file and offset where the last held batch exported ends
	heldFile string
	heldEnd  int64
}

var _ audit.RecordSink = (*Exporter)(nil)

// New creates ChainDir/ocsf and starts the exporter; pass it as audit.Config.Sink
// (the writer closes it).
func New(cfg Config) (*Exporter, error) {
	if cfg.ChainDir == "" {
		return nil, errors.New("ocsf: Config.ChainDir is empty")
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = 250 * time.Millisecond
	}
	if cfg.MaxLag <= 0 {
		cfg.MaxLag = 2 * time.Second
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.MaxHeld == 0 {
		cfg.MaxHeld = 8192
	}
	if cfg.ExportHeld == 0 {
		cfg.ExportHeld = max(cfg.MaxHeld/2, 1)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dir := filepath.Join(cfg.ChainDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ocsf: %w", err)
	}
	e := &Exporter{cfg: cfg, dir: dir, log: cfg.Logger, m: Mapper{Host: cfg.Host}, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	e.start()
	go e.run()
	return e, nil
}

// Written notes how far the chain is written and wakes the exporter. Called by the
// audit writer after each write.
func (e *Exporter) Written(_ string, lastSeq uint64) {
	e.target.Store(lastSeq)
	e.lastWrite.Store(time.Now().UnixNano())
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Records keeps a write's records for the export while fewer than MaxHeld are kept
// (else the export reads them from the chain). Called by the audit writer right before
// the Written of the same write.
func (e *Exporter) Records(b audit.WrittenBatch) {
	e.heldMu.Lock()
	if e.heldN+len(b.Recs) <= e.cfg.MaxHeld {
		e.held = append(e.held, b)
		e.heldN += len(b.Recs)
	}
	e.streaming = len(b.Recs) < streamBatch
	e.heldMu.Unlock()
}

// Room is how many more records Records would keep (audit.RecordSink).
func (e *Exporter) Room() int {
	e.heldMu.Lock()
	defer e.heldMu.Unlock()
	return max(e.cfg.MaxHeld-e.heldN, 0)
}

// streamBatch: a write of fewer records is a stream's, of more a burst's (the audit
// writer lingers for up to 256 records before it writes, and takes up to 4096 when
// they wait for it).
const streamBatch = 256

// Close exports what the chain holds beyond the last event, fsyncs and closes the
// files. Called once by the audit writer after its last Written.
func (e *Exporter) Close() error {
	close(e.stop)
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
	due := time.NewTimer(time.Hour)
	due.Stop()
	prune := time.Now()
	var behind time.Time // since when records wait for the export; zero: none
	schedule := func(now time.Time) {
		quiet := time.Unix(0, e.lastWrite.Load()).Add(e.cfg.Quiet)
		due.Reset(max(min(quiet.Sub(now), behind.Add(e.cfg.MaxLag).Sub(now)), 0))
	}
	for {
		select {
		case <-e.kick:
			now := time.Now()
			if behind.IsZero() {
				behind = now
			}
			if e.heldEnough() {
				due.Reset(0)
			} else {
				schedule(now)
			}
		case <-due.C:
			now := time.Now()
			if now.UnixNano()-e.lastWrite.Load() < int64(e.cfg.Quiet) && now.Sub(behind) < e.cfg.MaxLag && !e.heldEnough() {
				schedule(now)
				continue
			}
			from := e.next
			e.catchUp()
			behind = time.Time{}
			switch {
			case e.next > e.target.Load(): // caught up
			case e.next == from: // the chain could not be read: try again later
				behind = now
				due.Reset(e.cfg.MaxLag)
			default: // written meanwhile
				behind = now
				schedule(now)
			}
		case now := <-tick.C:
			e.sync()
			if now.Sub(prune) >= time.Minute {
				prune = now
				e.prune()
			}
		case <-e.stop:
			e.catchUp()
			e.closeFile()
			if e.src != nil {
				e.src.Close()
			}
			return
		}
	}
}

// heldEnough reports whether a stream's held records are due (Config.ExportHeld).
func (e *Exporter) heldEnough() bool {
	e.heldMu.Lock()
	defer e.heldMu.Unlock()
	return e.streaming && e.cfg.ExportHeld > 0 && e.heldN >= e.cfg.ExportHeld
}

// catchUp exports the chain's records up to the writer's last written seq: the held
// ones as they are, the others read from the chain.
func (e *Exporter) catchUp() {
	target := e.target.Load()
	for e.next <= target && (e.fromMemory(target) || e.readSome(target)) {
	}
	e.flush()
}

// fromMemory exports the held records from next on, up to target; false when the
// next record is not held (the chain is then read for it).
func (e *Exporter) fromMemory(target uint64) bool {
	progress := false
	for e.next <= target {
		e.heldMu.Lock()
		for len(e.held) > 0 && e.held[0].Recs[len(e.held[0].Recs)-1].Seq < e.next {
			e.popHeld() // read from the chain meanwhile
		}
		if len(e.held) == 0 {
			e.heldMu.Unlock()
			break
		}
		b := e.held[0]
		e.heldMu.Unlock()
		i := sort.Search(len(b.Recs), func(i int) bool { return b.Recs[i].Seq >= e.next })
		if b.Recs[i].Seq != e.next {
			break // not held (more than MaxHeld were waiting)
		}
		// The hashes are hex-encoded once, into one string: a record's is the next
		// one's prev.
		prev := b.Prev
		if i > 0 {
			prev = b.Hashes[i-1]
		}
		end := i // the held records up to target
		for end < len(b.Recs) && b.Recs[end].Seq <= target {
			end++
		}
		hexes := hex.AppendEncode(e.hexBuf[:0], prev[:])
		for _, h := range b.Hashes[i:end] {
			hexes = hex.AppendEncode(hexes, h[:])
		}
		e.hexBuf = hexes
		all := string(hexes)
		const n = 2 * len(prev)
		j := i
		for ; j < end; j++ {
			r := record.ReadBack(&b.Recs[j])
			k := j - i
			r.Prev, r.Hash = all[k*n:(k+1)*n], all[(k+1)*n:(k+2)*n]
			e.emit(b.File, &r)
			e.next = r.Seq + 1
		}
		e.fromHeld.Add(uint64(j - i))
		progress = true
		if j < len(b.Recs) {
			break // the rest is beyond target
		}
		e.heldFile, e.heldEnd = b.File, b.End
		e.heldMu.Lock()
		e.popHeld()
		e.heldMu.Unlock()
	}
	if progress && e.src != nil && filepath.Base(e.src.Name()) != e.heldFile {
		e.src.Close() // a later read opens the chain file of next
		e.src = nil
	} else if progress && e.src != nil {
		e.srcOff = max(e.srcOff, e.heldEnd)
	}
	return progress
}

// popHeld drops the oldest held batch; heldMu is held.
func (e *Exporter) popHeld() {
	e.heldN -= len(e.held[0].Recs)
	e.held[0] = audit.WrittenBatch{}
	e.held = e.held[1:]
}

// start finds where the export stands: after the last event of the newest OCSF file
// whose chain file still exists, else (a new export) at the current chain file's
// first record, or at seq 1 for a new log. New calls it, before the writer starts.
func (e *Exporter) start() {
	files := chainFiles(e.cfg.ChainDir)
	if len(files) == 0 {
		e.next = 1 // a new log
		return
	}
	for i := len(files) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(e.dir, ocsfName(files[i]))); err == nil {
			e.open(files[i])
			if e.next != 0 {
				return
			}
		}
	}
	e.next = max(fileFirst(files[len(files)-1]), 1)
}

// readSome exports the complete lines of the chain file being read, up to target,
// moving to the next chain file at the end of one; false when there is nothing more.
func (e *Exporter) readSome(target uint64) bool {
	if e.src == nil {
		files := chainFiles(e.cfg.ChainDir)
		if len(files) > 0 && fileFirst(files[0]) > e.next {
			// retention deleted chain files the export had not read: what remains
			e.log.Warn("ocsf export: chain files retained away before export", "from_seq", e.next, "to_seq", fileFirst(files[0])-1)
			e.next = fileFirst(files[0])
		}
		name := fileOf(files, e.next)
		if name == "" {
			return false
		}
		f, err := os.Open(filepath.Join(e.cfg.ChainDir, name))
		if err != nil {
			e.log.Warn("ocsf export: open the chain", "file", name, "err", err)
			return false
		}
		e.src, e.srcOff = f, 0
		if name == e.heldFile {
			e.srcOff = e.heldEnd // exported up to there from memory
		}
	}
	srcName := filepath.Base(e.src.Name())
	if cap(e.rbuf) < 1<<20 {
		e.rbuf = make([]byte, 1<<20)
	}
	n, err := e.src.ReadAt(e.rbuf[:cap(e.rbuf)], e.srcOff)
	if err != nil && !errors.Is(err, io.EOF) {
		e.log.Warn("ocsf export: read the chain", "file", srcName, "err", err)
		return false
	}
	data, progress := e.rbuf[:n], false
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := data[:i]
		seq := audit.LineSeq(line)
		if seq > target {
			return progress // written after target: not ours yet
		}
		if seq >= e.next {
			var r audit.Record
			if err := record.Parse(line, &r); err != nil {
				e.log.Warn("ocsf export: a chain line does not decode", "file", srcName, "seq", seq, "err", err)
			} else {
				e.emit(srcName, &r)
				e.fromChain.Add(1)
			}
			e.next = seq + 1
		}
		e.srcOff += int64(i) + 1
		data, progress = data[i+1:], true
	}
	if progress {
		return true
	}
	// at the end of this file: the chain has rotated when a later file begins at next
	files := chainFiles(e.cfg.ChainDir)
	if nextFile := fileOf(files, e.next); nextFile != "" && nextFile != srcName && fileFirst(nextFile) <= target {
		e.src.Close()
		e.src = nil
		return true
	}
	return false
}

// emit appends the events of r, read from the chain file file, switching OCSF files
// when the chain did.
func (e *Exporter) emit(file string, r *audit.Record) {
	if file != e.name {
		e.flush()
		next := e.next
		e.open(file)
		e.next = max(e.next, next)
	}
	e.buf = e.m.Append(e.buf, r)
	e.last.Store(r.Seq)
	if len(e.buf) >= 1<<20 {
		e.flush()
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
