package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AnchorFile is the name of the append-only file a DirSink writes in its directory.
const AnchorFile = "anchors.jsonl"

// Anchor kinds.
const (
	// AnchorCheckpoint anchors one checkpoint (a sealed file).
	AnchorCheckpoint = "checkpoint"
	// AnchorHead anchors one head (HeadFile): how far the log had been fsync'd.
	AnchorHead = "head"
)

// Anchor is a signed digest of a checkpoint or a head, shipped off the host to an
// AnchorSink (CloudTrail's digest files): each names the previous anchor shipped to the
// same sink (Prev, its Digest; Genesis for the first), so anchors removed from the sink
// break that chain, and VerifyAnchors compares the log on the host with them.
//
// Digest = hex(SHA-256(JSON of the anchor without digest and sig)); Sig =
// base64(Ed25519 signature over the raw Digest bytes) with the log's signing key.
type Anchor struct {
	// Kind is AnchorCheckpoint or AnchorHead.
	Kind string `json:"kind"`
	// LastSeq is the last record covered (the checkpoint's last seq, the head's seq),
	// LastHash that record's hash.
	LastSeq  uint64 `json:"last_seq"`
	LastHash string `json:"last_hash"`
	// Checkpoint is the checkpoint's hash (Kind checkpoint) or the hash of the last
	// checkpoint when the head was written (Kind head; empty: none yet).
	Checkpoint string `json:"checkpoint,omitempty"`
	// File, FirstSeq and FileSHA256 are the checkpoint's (Kind checkpoint only).
	File       string `json:"file,omitempty"`
	FirstSeq   uint64 `json:"first_seq,omitempty"`
	FileSHA256 string `json:"file_sha256,omitempty"`
	// Time is when the checkpoint or head was written.
	Time   time.Time `json:"time"`
	Prev   string    `json:"prev"`
	Digest string    `json:"digest,omitempty"`
	Sig    string    `json:"sig,omitempty"`
}

func (a Anchor) computeDigest() string {
	a.Digest, a.Sig = "", ""
	return jsonDigest(a)
}

// seal sets a's Prev, Digest and Sig (key may be nil: unsigned).
func (a *Anchor) seal(prev string, key ed25519.PrivateKey) {
	a.Prev = prev
	a.Digest = a.computeDigest()
	a.Sig = signDigest(key, a.Digest)
}

func checkpointAnchor(c Checkpoint) Anchor {
	return Anchor{Kind: AnchorCheckpoint, LastSeq: c.LastSeq, LastHash: c.LastHash, Checkpoint: c.Hash,
		File: c.File, FirstSeq: c.FirstSeq, FileSHA256: c.FileSHA256, Time: c.Time}
}

func headAnchor(h Head) Anchor {
	return Anchor{Kind: AnchorHead, LastSeq: h.Seq, LastHash: h.Hash, Checkpoint: h.Checkpoint, Time: h.Time}
}

// AnchorSink stores anchors somewhere the log's host cannot rewrite them (another
// mount, another machine).
type AnchorSink interface {
	// Name identifies the sink in logs and metrics ("dir", "http").
	Name() string
	// Last returns the digest of the last anchor the sink holds ("" when none), so
	// that a restarted writer continues the sink's chain.
	Last(ctx context.Context) (string, error)
	// Ship stores one sealed anchor; an error means it was not stored (retried).
	Ship(ctx context.Context, a Anchor) error
}

// DirSink appends anchors as JSON lines to AnchorFile in Dir, fsync'd, opened
// O_APPEND: Dir should be on another mount (another disk, an NFS or object-store
// mount, an append-only bind mount), one directory per audit log.
type DirSink struct {
	Dir string
}

// Name implements AnchorSink.
func (s DirSink) Name() string { return "dir" }

// Last implements AnchorSink: the digest on the last complete line.
func (s DirSink) Last(context.Context) (string, error) {
	as, err := ReadAnchors(s.Dir)
	if err != nil || len(as) == 0 {
		return "", err
	}
	return as[len(as)-1].Digest, nil
}

// Ship implements AnchorSink.
func (s DirSink) Ship(_ context.Context, a Anchor) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	return appendJSONLine(filepath.Join(s.Dir, AnchorFile), a)
}

// ReadAnchors returns the anchors of a DirSink directory in order; a torn last line
// (a crash while appending) is ignored.
func ReadAnchors(dir string) ([]Anchor, error) {
	return readJSONLines[Anchor](dir, AnchorFile)
}

// HTTPSink POSTs each anchor as a JSON object (Content-Type application/json) to URL;
// any 2xx stores it. Last GETs URL: 200 with the last anchor it holds as JSON, or 404
// or 204 when it holds none (405, a sink that only takes POSTs: the anchors after each
// start of the writer then begin a new chain at Genesis).
type HTTPSink struct {
	URL string
	// Client defaults to one with a 10 s timeout.
	Client *http.Client
}

// Name implements AnchorSink.
func (s HTTPSink) Name() string { return "http" }

func (s HTTPSink) client() *http.Client {
	if s.Client != nil {
		return s.Client
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// Last implements AnchorSink.
func (s HTTPSink) Last(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return "", err
	}
	resp, err := s.client().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNoContent,
		resp.StatusCode == http.StatusMethodNotAllowed: // a POST-only sink: each start begins a new chain
		return "", nil
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("GET %s: %s", s.URL, resp.Status)
	}
	var a Anchor
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&a); err != nil {
		return "", fmt.Errorf("GET %s: %w", s.URL, err)
	}
	return a.Digest, nil
}

// Ship implements AnchorSink.
func (s HTTPSink) Ship(ctx context.Context, a Anchor) error {
	body, err := json.Marshal(a)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client().Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", s.URL, resp.Status)
	}
	return nil
}

// anchorQueueSize bounds the anchors waiting for one sink; heads waiting are replaced
// by the newer head, so only checkpoints accumulate (one per sealed file).
const anchorQueueSize = 1024

// shipper ships one sink's anchors from its own goroutine: the writer only queues
// (never waits for the sink). A failed Ship is logged, counted and retried with
// backoff (1 s doubling to 30 s); a full queue drops the oldest anchor (counted).
type shipper struct {
	sink    AnchorSink
	key     ed25519.PrivateKey
	w       *Writer
	retry   time.Duration // first retry delay
	mu      sync.Mutex
	pending []Anchor
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	prev    string // digest of the last anchor shipped ("": not known yet)
}

func newShipper(w *Writer, sink AnchorSink) *shipper {
	s := &shipper{sink: sink, key: w.cfg.SigningKey, w: w, retry: time.Second,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

// add queues a; a head replaces a head still waiting at the end of the queue.
func (s *shipper) add(a Anchor) {
	s.mu.Lock()
	n := len(s.pending)
	switch {
	case a.Kind == AnchorHead && n > 0 && s.pending[n-1].Kind == AnchorHead:
		s.pending[n-1] = a
	case n >= anchorQueueSize:
		s.pending = append(s.pending[1:], a)
		s.w.anchorMetrics.dropped.WithLabelValues(s.sink.Name()).Inc()
	default:
		s.pending = append(s.pending, a)
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *shipper) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// close stops the shipper after it has shipped what is queued, waiting at most d.
func (s *shipper) close(d time.Duration) {
	close(s.stop)
	select {
	case <-s.done:
	case <-time.After(d):
		s.w.log.Warn("audit anchors not shipped at close", "sink", s.sink.Name(), "pending", s.queued())
	}
}

func (s *shipper) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
		case <-s.stop:
			t := time.NewTimer(5 * time.Second) // let a last Ship in progress finish, then give up
			defer t.Stop()
			select {
			case <-s.done:
			case <-t.C:
				cancel()
			}
		}
	}()
	backoff := s.retry
	for {
		err := s.shipAll(ctx)
		if err == nil {
			backoff = s.retry
			select {
			case <-s.kick:
				continue
			case <-s.stop:
				if s.shipAll(ctx) != nil || s.queued() > 0 {
					continue // retried below until close gives up
				}
				return
			}
		}
		s.w.log.Warn("audit anchor not shipped; retrying", "sink", s.sink.Name(), "err", err, "retry_in", backoff)
		s.w.anchorMetrics.failures.WithLabelValues(s.sink.Name()).Inc()
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// shipAll ships the queued anchors in order, sealing each onto the sink's chain.
func (s *shipper) shipAll(ctx context.Context) error {
	if s.prev == "" {
		last, err := s.sink.Last(ctx)
		if err != nil {
			return fmt.Errorf("last anchor: %w", err)
		}
		if s.prev = last; last == "" {
			s.prev = Genesis
		}
	}
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			s.mu.Unlock()
			return nil
		}
		a := s.pending[0]
		s.mu.Unlock()
		a.seal(s.prev, s.key)
		if err := s.sink.Ship(ctx, a); err != nil {
			s.prev = "" // ask the sink again: the anchor may have been stored after all
			return err
		}
		s.prev = a.Digest
		s.mu.Lock()
		// the head at [0] may have been replaced meanwhile only if it was also the last
		if len(s.pending) > 0 && s.pending[0].Time.Equal(a.Time) && s.pending[0].Kind == a.Kind && s.pending[0].LastSeq == a.LastSeq {
			s.pending = s.pending[1:]
		}
		s.mu.Unlock()
		s.w.anchorMetrics.shipped.WithLabelValues(s.sink.Name()).Inc()
	}
}

// anchor queues a for every configured sink (Config.Anchors).
func (w *Writer) anchor(a Anchor) {
	for _, s := range w.shippers {
		s.add(a)
	}
}

// anchorMetrics are the airlock_audit_anchor* series.
type anchorMetrics struct {
	shipped, failures, dropped *prometheus.CounterVec
}

// startAnchors registers the anchor metrics and starts one shipper per
// Config.Anchors sink.
func (w *Writer) startAnchors() error {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "airlock", Subsystem: "audit", Name: name, Help: help}
	}
	m := &anchorMetrics{
		shipped:  prometheus.NewCounterVec(opts("anchors_shipped_total", "Signed checkpoint and head digests stored by an anchor sink."), []string{"sink"}),
		failures: prometheus.NewCounterVec(opts("anchor_failures_total", "Failed attempts to ship anchors to a sink (each retried)."), []string{"sink"}),
		dropped:  prometheus.NewCounterVec(opts("anchors_dropped_total", "Anchors dropped unshipped because the sink's queue was full."), []string{"sink"}),
	}
	if w.cfg.Registry != nil && len(w.cfg.Anchors) > 0 {
		for _, c := range []prometheus.Collector{m.shipped, m.failures, m.dropped} {
			if err := w.cfg.Registry.Register(c); err != nil {
				return err
			}
		}
	}
	w.anchorMetrics = m
	for _, sink := range w.cfg.Anchors {
		w.shippers = append(w.shippers, newShipper(w, sink))
	}
	return nil
}

// closeAnchors ships what is queued (at most AnchorCloseTimeout) and stops.
func (w *Writer) closeAnchors() {
	for _, s := range w.shippers {
		s.close(AnchorCloseTimeout)
	}
}

// AnchorCloseTimeout is how long Close waits for queued anchors to be shipped.
const AnchorCloseTimeout = 10 * time.Second
