package audit

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Writer.
type Config struct {
	// Dir holds the log files (created 0700 if missing). One Writer per directory.
	Dir string
	// SyncInterval is the longest time a written record waits for fsync; default 100ms.
	SyncInterval time.Duration
	// MaxFileBytes rotates the current file once it reaches this size; default
	// DefaultMaxFileBytes (64 MiB).
	MaxFileBytes int64
	// Linger is how long the writer waits for more records once one arrives, so that a
	// steady stream goes out in few write(2) calls (group commit); default 10ms (a tenth
	// of the default SyncInterval), negative means no wait. A record is not durable
	// before the next fsync either way. A longer wait makes fewer, larger batches: at a
	// gateway's 8000 requests/s, 2ms made batches of about 16 records and cost each
	// request's record about 1-3 µs more CPU than 10ms (TestBenchGateway, 4 runs each).
	Linger time.Duration
	// QueueSize is how many records Append may buffer before counting losses; default
	// 65536. Half of it is reserved in equal shares per source, so that a flood of one
	// source loses only its own records (see shares in queue.go).
	QueueSize int
	// RateLimit bounds the records per sandbox (or client address) and source; the
	// zero value limits nothing. Servers use DefaultRateLimit (stack.AuditConfig).
	RateLimit RateLimit
	// Retention deletes the oldest finished files by total size and age; the zero
	// value keeps every file.
	Retention Retention
	// SigningKey, when set, signs every rotation checkpoint and the head (Ed25519);
	// Verify checks signatures with the matching public key.
	SigningKey ed25519.PrivateKey
	// HeadInterval is how often, at most, the head (HeadFile: the last fsync'd seq and
	// hash, signed) is rewritten while records are written; it is also rewritten at
	// every checkpoint, at open and at Close. Default DefaultHeadInterval (1 s): a cut
	// of the log's tail is detected down to what was written in the last interval.
	HeadInterval time.Duration
	// Logger receives write errors and losses; default slog.Default().
	Logger *slog.Logger
	// Registry receives the airlock_audit_* metrics; nil means none.
	Registry prometheus.Registerer
	// Sink, when set, is told of every write to the chain, for an export that reads
	// the chain files behind the writer (audit/ocsf), and handed the written records
	// when it is a RecordSink; Close closes it. nil: none.
	Sink Sink
	// Anchors receive a signed digest of every checkpoint and head (anchor.go),
	// shipped from a goroutine per sink with a bounded queue: a sink that fails never
	// blocks the writer (logged, counted, retried). None: nothing leaves the host.
	Anchors []AnchorSink
}

// DefaultMaxFileBytes is the size, in bytes, at which a log file is sealed by a
// checkpoint and the next one begun (Config.MaxFileBytes).
const DefaultMaxFileBytes = 64 << 20

// ErrClosed is returned by operations on a closed Writer.
var ErrClosed = errors.New("audit: writer closed")

// maxBatch bounds how many records one write(2) carries; the writer lingers
// (Config.Linger) only while a batch is smaller than lingerBatch.
const maxBatch, lingerBatch = 4096, 256

// Writer appends records to a hash-chained JSON Lines log (see the chain format in
// chain.go and README.md). Append never blocks for long: a full queue counts the record
// as lost, and the writer then appends a "loss" record per source with the count, so a
// loss is always visible in the log itself. A background goroutine, started by New and
// stopped by Close, encodes, writes (one write per batch), fsyncs at most every
// SyncInterval and rotates files at MaxFileBytes, writing a chained (optionally
// signed) checkpoint for each finished file.
type Writer struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	mu     sync.RWMutex // write-locked only by Close, to stop Appends
	closed bool
	queue  chan queued
	shares *shares
	limit  *Limiter // nil: no rate limit
	lost   sync.Map // Source -> *atomic.Uint64
	stop   chan struct{}
	done   chan struct{}

	// owned by the run goroutine
	f          *os.File
	name       string
	size       int64
	fileHash   hash.Hash
	fileFirst  uint64
	firstTime  time.Time
	lastTime   time.Time
	seq        uint64
	prev       [32]byte // hash of record seq (Genesis: zeros)
	checkpoint string   // hash of the last checkpoint
	dirty      bool
	batch      []Record
	sealer     sealer // chain position while a batch is sealed; prev once written
	recSink    RecordSink
	handoff    WrittenBatch // the sealed records of w.buf, for recSink
	// room is how many more records recSink keeps (RecordSink.Room, asked once per
	// batch); handFull: this write's records do not fit, none is copied for it
	room     int
	handFull bool
	buf      []byte   // the sealed lines not yet written
	sources  []Source // the source of each line in buf, for loss accounting

	// Off-host anchors (anchor.go).
	shippers      []*shipper
	anchorMetrics *anchorMetrics

	// The head as last written (head.go).
	headSeq        uint64
	headCheckpoint string
	headAt         time.Time

	// diskBytes is the size of the log files in Dir (metric airlock_audit_disk_bytes).
	diskBytes atomic.Int64
	// retained is when retention last ran (run goroutine).
	retained time.Time

	synced  atomic.Uint64
	written atomic.Uint64
	err     atomic.Pointer[error]
}

// New opens (or creates) the log in cfg.Dir, recovers the chain's tail after a crash
// (a torn last line is cut off), and starts the writer goroutine.
func New(cfg Config) (*Writer, error) {
	w, err := open(cfg)
	if err != nil {
		return nil, err
	}
	go w.run()
	return w, nil
}

// open prepares a Writer without starting its goroutine.
func open(cfg Config) (*Writer, error) {
	if cfg.Dir == "" {
		return nil, errors.New("audit: Config.Dir is empty")
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 100 * time.Millisecond
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 65536
	}
	if cfg.Linger == 0 {
		cfg.Linger = 10 * time.Millisecond
	}
	if cfg.HeadInterval <= 0 {
		cfg.HeadInterval = DefaultHeadInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	w := &Writer{cfg: cfg, log: cfg.Logger, queue: make(chan queued, cfg.QueueSize), shares: newShares(cfg.QueueSize),
		stop: make(chan struct{}), done: make(chan struct{})}
	w.recSink, _ = cfg.Sink.(RecordSink)
	if cfg.RateLimit.Rate > 0 || cfg.RateLimit.RefusalRate > 0 {
		w.limit = NewLimiter(cfg.RateLimit)
	}
	var err error
	if w.metrics, err = newMetrics(cfg.Registry, func() float64 { return float64(len(w.queue)) }, w.diskBytes.Load); err != nil {
		return nil, err
	}
	if err := w.startAnchors(); err != nil {
		return nil, err
	}
	if err := w.recover(); err != nil {
		w.closeAnchors()
		if w.f != nil {
			w.f.Close()
		}
		return nil, err
	}
	w.synced.Store(w.seq)
	w.written.Store(w.seq)
	w.retain(time.Now(), true)
	if w.maybeHead(time.Now(), true); w.headAt.IsZero() {
		w.closeAnchors()
		w.f.Close()
		return nil, w.Err()
	}
	return w, nil
}

// Append queues r for writing and returns at once. Seq, Prev and Hash are assigned by
// the writer; a zero Time becomes the time of Append. A record over its key's rate
// (Config.RateLimit) is counted into a suppressed record instead. When the source's
// share of the queue is full (or the writer is closed) the record is counted as lost
// for its source.
func (w *Writer) Append(r Record) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		w.countLost(r.Source)
		w.metrics.afterClose.Inc()
		return
	}
	// admitted under the read lock: Close waits for it, so the writer's last flush
	// of suppressed records sees every count
	if w.admit(&r) && !w.enqueue(r) {
		w.countLost(r.Source)
	}
	w.mu.RUnlock()
}

// admit applies the rate limit: false when r is counted as suppressed.
func (w *Writer) admit(r *Record) bool {
	if w.limit == nil || w.limit.Allow(r) {
		return true
	}
	w.metrics.suppressed.WithLabelValues(string(r.Source)).Inc()
	return false
}

// enqueue puts r in its source's share of the queue; false when that is full.
func (w *Writer) enqueue(r Record) bool {
	shared, ok := w.shares.take(r.Source)
	if !ok {
		return false
	}
	e := queued{rec: r, shared: shared}
	select {
	case w.queue <- e:
		return true
	default: // not reached: the shares add up to the channel's capacity
		w.shares.release(&e)
		return false
	}
}

// dequeue takes the next record off the queue (which must not be empty).
func (w *Writer) dequeue() Record {
	e := <-w.queue
	w.shares.release(&e)
	return e.rec
}

// TryAppend is Append for callers that can wait: it reports false, counting nothing,
// when the source's share of the queue is full or the writer closed, so the caller may
// retry. A record over its rate limit is counted as suppressed and reported true. The
// data path uses Append.
func (w *Writer) TryAppend(r Record) bool {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return false
	}
	return !w.admit(&r) || w.enqueue(r)
}

func (w *Writer) countLost(s Source) {
	v, ok := w.lost.Load(s)
	if !ok {
		v, _ = w.lost.LoadOrStore(s, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
	w.metrics.lost.WithLabelValues(string(s)).Inc()
}

// Synced returns the seq of the last record known to be on stable storage.
func (w *Writer) Synced() uint64 { return w.synced.Load() }

// Written returns the seq of the last record handed to the file system.
func (w *Writer) Written() uint64 { return w.written.Load() }

// Err returns the last write error, if any (writes are retried with the next batch).
func (w *Writer) Err() error {
	if p := w.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops accepting records, writes everything queued (and the loss records),
// fsyncs and closes the file. It is safe to call more than once.
func (w *Writer) Close() error {
	w.mu.Lock()
	already := w.closed
	w.closed = true
	w.mu.Unlock()
	if !already {
		close(w.stop)
	}
	<-w.done
	if !already {
		w.closeAnchors()
	}
	if !already && w.cfg.Sink != nil {
		if err := w.cfg.Sink.Close(); err != nil {
			w.log.Warn("audit sink close", "err", err)
		}
	}
	return w.Err()
}

func (w *Writer) run() {
	defer close(w.done)
	tick := time.NewTicker(w.cfg.SyncInterval)
	defer tick.Stop()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		select {
		case e := <-w.queue:
			w.shares.release(&e)
			w.batch = append(w.batch[:0], e.rec)
			for len(w.batch) < maxBatch && len(w.queue) > 0 {
				w.batch = append(w.batch, w.dequeue())
			}
			if w.cfg.Linger > 0 && len(w.batch) < lingerBatch {
				// Sleep out the linger instead of taking records one by one: a parked
				// writer woken by every Append costs the appender a wakeup per record.
				linger.Reset(w.cfg.Linger)
				select {
				case <-linger.C:
				case <-w.stop: // written now; the next turn of the loop stops
				}
				linger.Stop()
			}
			for len(w.batch) < maxBatch && len(w.queue) > 0 {
				w.batch = append(w.batch, w.dequeue())
			}
			w.writeBatch(w.batch)
			w.writeLoss()
		case now := <-tick.C:
			w.writeSuppressed(now, false)
			w.writeLoss()
			w.sync()
			w.maybeHead(now, false)
			w.retain(now, false)
		case <-w.stop:
			for {
				w.batch = w.batch[:0]
				for len(w.batch) < maxBatch && len(w.queue) > 0 {
					w.batch = append(w.batch, w.dequeue())
				}
				if len(w.batch) == 0 {
					break
				}
				w.writeBatch(w.batch)
			}
			w.writeSuppressed(time.Now(), true)
			w.writeLoss()
			w.sync()
			w.maybeHead(time.Now(), true)
			if err := w.f.Close(); err != nil {
				w.setErr(err)
			}
			return
		}
	}
}

// writeSuppressed writes the rate limiter's suppressed records that are due (all of
// them when all is set). They never pass through the queue, so they cannot be lost to
// a full one.
func (w *Writer) writeSuppressed(now time.Time, all bool) {
	if w.limit == nil {
		return
	}
	if recs := w.limit.Flush(now, all); len(recs) > 0 {
		w.writeBatch(recs)
	}
}

// writeLoss turns the lost counters into loss records.
func (w *Writer) writeLoss() {
	var recs []Record
	w.lost.Range(func(k, v any) bool {
		if n := v.(*atomic.Uint64).Swap(0); n > 0 {
			recs = append(recs, Record{Time: time.Now(), Source: k.(Source), Action: ActionLoss,
				Reason: "audit queue full: records dropped", Extra: map[string]any{"lost": n}})
			w.log.Warn("audit records lost", "source", string(k.(Source)), "lost", n)
		}
		return true
	})
	if len(recs) > 0 {
		w.writeBatch(recs)
	}
}

// writeBatch seals and writes records, one write per file (a batch that reaches
// MaxFileBytes is split there and the file rotated). On failure the file is cut back to
// its last good size and the unwritten records count as lost. It sets each record's
// Seq; Prev and Hash are left alone (only the chain state keeps the last hash).
func (w *Writer) writeBatch(recs []Record) {
	w.buf, w.sources = w.buf[:0], w.sources[:0]
	seq, first, last := w.seq, w.firstTime, w.lastTime
	w.sealer.prev = w.prev
	if w.recSink != nil {
		w.room, w.handFull = w.recSink.Room(), false
	}
	for i := range recs {
		r := &recs[i]
		r.Seq = seq + 1
		prev := w.sealer.prev
		var err error
		if w.buf, err = w.sealer.seal(w.buf, r); err != nil {
			// an Extra value json cannot encode: record the fact instead
			r.Extra = map[string]any{"encode_error": err.Error()}
			if w.buf, err = w.sealer.seal(w.buf, r); err != nil {
				w.countLost(r.Source)
				continue
			}
		}
		switch {
		case w.recSink == nil || w.handFull:
		case len(w.handoff.Recs) >= w.room: // the sink would drop this write's records
			w.handoff, w.handFull = WrittenBatch{}, true
		default:
			if w.handoff.Recs == nil { // the sink's: new slices per write
				n := min(len(recs)-i, w.room)
				w.handoff = WrittenBatch{Recs: make([]Record, 0, n), Hashes: make([][32]byte, 0, n), Prev: prev}
			}
			w.handoff.Recs = append(w.handoff.Recs, *r)
			w.handoff.Hashes = append(w.handoff.Hashes, w.sealer.prev)
		}
		seq = r.Seq
		if first.IsZero() {
			first = r.Time
		}
		last = r.Time
		w.sources = append(w.sources, r.Source)
		if w.size+int64(len(w.buf)) >= w.cfg.MaxFileBytes {
			if !w.commit(seq, first, last) {
				for j := i + 1; j < len(recs); j++ {
					w.countLost(recs[j].Source)
				}
				return
			}
			w.rotate()
			w.buf, w.sources = w.buf[:0], w.sources[:0]
			first, last = w.firstTime, w.lastTime
		}
	}
	w.commit(seq, first, last)
}

// commit writes w.buf (the sealed lines of records from w.sources, the last one seq)
// and advances the chain state to w.sealer's. On failure the records count as lost.
func (w *Writer) commit(seq uint64, first, last time.Time) bool {
	if len(w.buf) == 0 {
		return true
	}
	if _, err := w.f.Write(w.buf); err != nil {
		w.setErr(fmt.Errorf("audit: write %s: %w", w.name, err))
		w.metrics.writeErrors.Inc()
		if terr := w.f.Truncate(w.size); terr != nil {
			w.log.Error("audit truncate after failed write", "file", w.name, "err", terr)
		}
		for _, s := range w.sources {
			w.countLost(s)
		}
		w.handoff = WrittenBatch{}
		return false
	}
	w.fileHash.Write(w.buf)
	w.size += int64(len(w.buf))
	w.diskBytes.Add(int64(len(w.buf)))
	w.seq, w.prev, w.firstTime, w.lastTime = seq, w.sealer.prev, first, last
	w.dirty = true
	w.written.Store(seq)
	w.metrics.records.Add(float64(len(w.sources)))
	w.metrics.bytes.Add(float64(len(w.buf)))
	if w.recSink != nil && len(w.handoff.Recs) > 0 {
		w.handoff.File, w.handoff.End = w.name, w.size
		w.recSink.Records(w.handoff)
		w.room -= len(w.handoff.Recs)
		w.handoff = WrittenBatch{}
	}
	w.handFull = false // the next write (after a rotation) is handed over if it fits
	if w.cfg.Sink != nil {
		w.cfg.Sink.Written(w.name, seq)
	}
	return true
}

func (w *Writer) sync() {
	if !w.dirty {
		return
	}
	t0 := time.Now()
	if err := w.f.Sync(); err != nil {
		w.setErr(fmt.Errorf("audit: fsync %s: %w", w.name, err))
		w.metrics.writeErrors.Inc()
		return
	}
	w.metrics.fsync.Observe(time.Since(t0).Seconds())
	w.dirty = false
	w.synced.Store(w.seq)
}

func (w *Writer) setErr(err error) {
	w.log.Error("audit write failed", "err", err)
	w.err.Store(&err)
}

// rotate finishes the current file (fsync, checkpoint) and opens the next.
func (w *Writer) rotate() {
	w.sync()
	if w.dirty {
		return // fsync failed: keep writing to the same file, retry later
	}
	cp := Checkpoint{File: w.name, FirstSeq: w.fileFirst, LastSeq: w.seq, FirstTime: w.firstTime, LastTime: w.lastTime,
		LastHash: hex.EncodeToString(w.prev[:]), FileSHA256: fmt.Sprintf("%x", w.fileHash.Sum(nil))}
	if err := w.appendCheckpoint(&cp); err != nil {
		w.setErr(err)
		return
	}
	w.maybeHead(time.Now(), true)
	if err := w.f.Close(); err != nil {
		w.setErr(err)
	}
	if err := w.openFile(w.seq + 1); err != nil {
		w.setErr(err)
		// keep going on the old name by reopening it for append
		if f, ferr := os.OpenFile(filepath.Join(w.cfg.Dir, w.name), os.O_WRONLY|os.O_APPEND, 0o600); ferr == nil {
			w.f = f
		}
		return
	}
	w.metrics.rotations.Inc()
	w.retain(time.Now(), true)
}

// openFile creates the file whose first record will be seq.
func (w *Writer) openFile(seq uint64) error {
	name := fileName(seq)
	f, err := os.OpenFile(filepath.Join(w.cfg.Dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	w.f, w.name, w.size, w.fileHash, w.fileFirst = f, name, 0, sha256.New(), seq
	w.firstTime, w.lastTime = time.Time{}, time.Time{}
	return syncDir(w.cfg.Dir)
}

func fileName(firstSeq uint64) string { return fmt.Sprintf("audit-%020d.jsonl", firstSeq) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
