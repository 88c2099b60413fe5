package audit

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// HeadFile is the name of the signed head inside the audit directory.
const HeadFile = "head.json"

// DefaultHeadInterval is how often, at most, the writer rewrites the head while records
// are being written (Config.HeadInterval).
const DefaultHeadInterval = time.Second

// Head is the log's signed head: how far the chain went when the writer last wrote it.
// Checkpoints seal finished files, so cutting records off the end of the log together
// with its trailing checkpoints leaves a log that chains; the head, written apart from
// the files (HeadFile, replaced atomically), still names the later seq, and Verify
// reports the cut as a break ("truncated").
//
// Digest = hex(SHA-256(canonical JSON of the head without digest and sig)); Sig, when
// the writer has a signing key, is base64(Ed25519 signature over the raw Digest bytes),
// the key that signs the checkpoints.
//
// A head only names records already fsync'd, so a crash never leaves a head ahead of
// the log. What it cannot show is an older head put back together with a log cut to
// match (a replay of the writer's own signed statement): Verify reports the head's time
// (Report.Head), and only an anchor kept off the host (issue 26: checkpoints and heads
// shipped elsewhere) closes that.
type Head struct {
	// Seq is the last record the writer had fsync'd (0: none yet), Hash its hash
	// (Genesis when Seq is 0).
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	// Checkpoint is the hash of the last checkpoint then (empty: none).
	Checkpoint string    `json:"checkpoint,omitempty"`
	Time       time.Time `json:"time"`
	Digest     string    `json:"digest,omitempty"`
	Sig        string    `json:"sig,omitempty"`
}

func (h Head) computeDigest() string {
	h.Digest, h.Sig = "", ""
	return jsonDigest(h)
}

// HeadInfo is what Verify reports of the head.
type HeadInfo struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// AgeSeconds is how old the head was when Verify read it: an old head on a log
	// that is being written is a head put back (or a writer that stopped).
	AgeSeconds float64 `json:"age_s"`
	Signed     bool    `json:"signed"`
}

// ReadHead returns the head in dir, nil when there is none.
func ReadHead(dir string) (*Head, error) {
	b, err := os.ReadFile(filepath.Join(dir, HeadFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var h Head
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("audit: %s: %w", HeadFile, err)
	}
	return &h, nil
}

// maybeHead rewrites the head when the durable end of the chain moved since the last
// one and HeadInterval has passed (or force is set). It writes nothing while the file
// has records not yet fsync'd (dirty): a head never runs ahead of the disk.
func (w *Writer) maybeHead(now time.Time, force bool) {
	if w.dirty {
		return
	}
	moved := w.seq != w.headSeq || w.checkpoint != w.headCheckpoint || w.headAt.IsZero()
	if !moved || !force && now.Sub(w.headAt) < w.cfg.HeadInterval {
		return
	}
	if err := w.writeHead(now); err != nil {
		w.setErr(err)
		w.metrics.writeErrors.Inc()
		return
	}
	w.headSeq, w.headCheckpoint, w.headAt = w.seq, w.checkpoint, now
}

// writeHead writes the head of the chain as it stands (w.seq, w.prev, w.checkpoint):
// a temporary file, fsync'd, renamed over HeadFile.
func (w *Writer) writeHead(now time.Time) error {
	h := Head{Seq: w.seq, Hash: hex.EncodeToString(w.prev[:]), Checkpoint: w.checkpoint, Time: now.UTC().Truncate(time.Microsecond)}
	h.Digest = h.computeDigest()
	h.Sig = signDigest(w.cfg.SigningKey, h.Digest)
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	path := filepath.Join(w.cfg.Dir, HeadFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("audit: head: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("audit: head: %w", err)
	}
	w.anchor(headAnchor(h))
	return nil
}

// headCheck holds what Verify needs of the head while it scans the records.
type headCheck struct {
	head *Head
	seen bool // the record at head.Seq was found and matched
}

// checkHead verifies the head's digest and signature (the same rules as checkpoints:
// with opts.PublicKey it must be signed by that key, unless opts.UnsignedBefore and no
// checkpoint is signed) and records it in rep. A missing head is a break with
// opts.PublicKey once a checkpoint says its writer kept one (Checkpoint.Head), or
// without opts.UnsignedBefore; otherwise a warning (a log older than heads).
func checkHead(dir string, rep *Report, cps []Checkpoint, opts VerifyOptions, now time.Time) (*headCheck, error) {
	h, err := ReadHead(dir)
	loc := Location{File: HeadFile, Line: 1}
	if err != nil {
		_, berr := rep.broken(loc, "the head is not readable: "+err.Error())
		return nil, berr
	}
	signedCP := slices.ContainsFunc(cps, func(c Checkpoint) bool { return c.Sig != "" })
	if h == nil {
		marked := slices.ContainsFunc(cps, func(c Checkpoint) bool { return c.Head })
		switch {
		case opts.PublicKey != nil && (marked || !opts.UnsignedBefore):
			_, berr := rep.broken(loc, "the signed head is missing (removed?): a cut-off tail cannot be ruled out")
			return nil, berr
		case marked:
			rep.Warnings = append(rep.Warnings, "the head is missing although the log's writer kept one: a cut-off tail cannot be ruled out")
		default:
			rep.Warnings = append(rep.Warnings, "no head (a log written before heads): a cut-off tail cannot be detected")
		}
		return &headCheck{}, nil
	}
	loc.Seq = h.Seq
	if h.computeDigest() != h.Digest {
		_, berr := rep.broken(loc, "the head's digest does not match its contents")
		return nil, berr
	}
	switch {
	case h.Sig != "" && opts.PublicKey != nil:
		if raw, _ := hex.DecodeString(h.Digest); !verifySig(opts.PublicKey, raw, h.Sig) {
			_, berr := rep.broken(loc, "the head's signature does not verify with the given public key")
			return nil, berr
		}
	case h.Sig == "" && opts.PublicKey != nil && (signedCP || !opts.UnsignedBefore):
		_, berr := rep.broken(loc, "the head is not signed but a public key was given")
		return nil, berr
	}
	if h.Checkpoint != "" && !slices.ContainsFunc(cps, func(c Checkpoint) bool { return c.Hash == h.Checkpoint }) {
		_, berr := rep.broken(loc, fmt.Sprintf("truncated: the signed head names checkpoint %.12s…, which %s no longer holds", h.Checkpoint, CheckpointFile))
		return nil, berr
	}
	rep.Head = &HeadInfo{Seq: h.Seq, Time: h.Time, AgeSeconds: now.Sub(h.Time).Seconds(), Signed: h.Sig != ""}
	return &headCheck{head: h}, nil
}

// record checks the record at seq against the head.
func (hc *headCheck) record(seq uint64, hash string) (bool, string) {
	if hc.head == nil || seq != hc.head.Seq {
		return true, ""
	}
	hc.seen = true
	if hash != hc.head.Hash {
		return false, "the record's hash is not the one the signed head names (log rewritten after the head)"
	}
	return true, ""
}

// end checks, once every record was read, that the log reaches the head.
func (hc *headCheck) end(rep *Report, cps []Checkpoint, last Location) error {
	h := hc.head
	if h == nil || h.Seq == 0 {
		return nil
	}
	if rep.LastSeq < h.Seq {
		_, err := rep.broken(last, fmt.Sprintf("truncated: the log ends at seq %d but the signed head says %d (head written %s)",
			rep.LastSeq, h.Seq, h.Time.Format(time.RFC3339)))
		return err
	}
	if !hc.seen {
		// Before the first remaining record (retained away): its checkpoint, if any.
		if i := slices.IndexFunc(cps, func(c Checkpoint) bool { return c.LastSeq == h.Seq }); i >= 0 && cps[i].LastHash != h.Hash {
			_, err := rep.broken(Location{File: CheckpointFile, Line: i + 1, Seq: h.Seq}, "the checkpoint's last hash is not the one the signed head names")
			return err
		}
	}
	return nil
}
