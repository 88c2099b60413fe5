package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// ErrBroken is wrapped by Verify's error when the chain does not hold.
var ErrBroken = errors.New("audit chain broken")

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// PublicKey checks checkpoint signatures; without it signatures are not checked
	// (Report.UnverifiedSignatures counts them).
	PublicKey ed25519.PublicKey
	// UnsignedBefore, with PublicKey, accepts unsigned checkpoints that come before the
	// first signed one (a log written before its writer had a signing key) and reports
	// them in Report.Warnings; every checkpoint after a signed one must still be signed.
	// Without it, every checkpoint must be signed when PublicKey is set.
	UnsignedBefore bool
}

// Location is a place in the log.
type Location struct {
	File string `json:"file"`
	// Line is 1-based within File.
	Line int `json:"line"`
	// Seq is the record's seq as written (0 when unreadable).
	Seq uint64 `json:"seq,omitempty"`
}

// Break is the first place where the chain does not hold.
type Break struct {
	Location
	Reason string `json:"reason"`
}

// Report is what Verify found.
type Report struct {
	Files       int    `json:"files"`
	Records     uint64 `json:"records"`
	FirstSeq    uint64 `json:"first_seq"`
	LastSeq     uint64 `json:"last_seq"`
	LastHash    string `json:"last_hash"`
	Checkpoints int    `json:"checkpoints"`
	// Lost sums the "lost" counts of loss records: records the writer had to drop.
	Lost uint64 `json:"lost"`
	// TornTail is set when the last file ends with an incomplete line (a crash while
	// writing); that line is not part of the chain and the writer cuts it on restart.
	TornTail             *Location `json:"torn_tail,omitempty"`
	UnverifiedSignatures int       `json:"unverified_signatures,omitempty"`
	// VerifiedSignatures counts the checkpoint signatures checked with
	// VerifyOptions.PublicKey.
	VerifiedSignatures int `json:"verified_signatures,omitempty"`
	// Warnings are findings that do not break the chain (a finished file without a
	// checkpoint, for example).
	Warnings []string `json:"warnings,omitempty"`
	// RetainedFiles counts the finished files before the first one present, removed by
	// retention (audit.Retention) or archived: expected, since the first remaining
	// record links to AnchoredBy's checkpoint (its file's last hash).
	RetainedFiles int `json:"retained_files,omitempty"`
	// AnchoredBy is the file whose checkpoint anchors a log that starts after seq 1.
	AnchoredBy string `json:"anchored_by,omitempty"`
	// Head is the signed head (HeadFile) the log was checked against: the seq the
	// writer had reached and when; nil when there is none.
	Head *HeadInfo `json:"head,omitempty"`
	// Broken is the first break, nil when the chain holds.
	Broken *Break `json:"broken,omitempty"`
}

// Verify proves the chain in dir: every line's hash, every link to the previous record
// (across files), consecutive seqs, and every checkpoint (its own chain, the file's
// SHA-256, last seq and hash, and the signature when opts has a key). It stops at the
// first break and returns the report with an error wrapping ErrBroken; I/O problems
// return other errors. A log whose oldest files were removed verifies from a
// checkpoint of the file before its first one. opts is optional (at most one).
func Verify(dir string, options ...VerifyOptions) (*Report, error) {
	var opts VerifyOptions
	if len(options) > 0 {
		opts = options[0]
	}
	rep := &Report{}
	files, err := logFiles(dir)
	if err != nil {
		return nil, err
	}
	cps, err := ReadCheckpoints(dir)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrBroken, err)
	}
	byFile := map[string]Checkpoint{}
	bySeq := map[uint64]Checkpoint{}
	cpPrev := Genesis
	signed, unsigned := false, 0
	for i, c := range cps {
		rep.Checkpoints++
		byFile[c.File], bySeq[c.LastSeq] = c, c
		loc := Location{File: CheckpointFile, Line: i + 1, Seq: c.LastSeq}
		switch {
		case c.Prev != cpPrev:
			return rep.broken(loc, "checkpoint prev does not match the previous checkpoint's hash")
		case c.computeHash() != c.Hash:
			return rep.broken(loc, "checkpoint hash does not match its contents")
		}
		cpPrev = c.Hash
		switch {
		case c.Sig != "" && opts.PublicKey == nil:
			rep.UnverifiedSignatures++
		case c.Sig != "":
			if raw, _ := hex.DecodeString(c.Hash); !verifySig(opts.PublicKey, raw, c.Sig) {
				return rep.broken(loc, "checkpoint signature does not verify with the given public key")
			}
			rep.VerifiedSignatures++
			signed = true
		case opts.PublicKey != nil && opts.UnsignedBefore && !signed:
			unsigned++
		case opts.PublicKey != nil:
			return rep.broken(loc, "checkpoint is not signed but a public key was given")
		}
	}
	if unsigned > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("the first %d checkpoints are not signed (written before the log had a signing key)", unsigned))
	}
	hc, err := checkHead(dir, rep, cps, opts, time.Now())
	if err != nil {
		return rep, err
	}
	var lastLoc Location
	prev, next := Genesis, uint64(1)
	for fi, name := range files {
		rep.Files++
		last := fi == len(files)-1
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return rep, err
		}
		h := sha256.New()
		r := bufio.NewReaderSize(f, 1<<20)
		lineNo, fileRecords := 0, 0
		var fileLastSeq uint64
		var fileLastHash string
		for {
			line, rerr := r.ReadBytes('\n')
			if len(line) == 0 && rerr == io.EOF {
				break
			}
			lineNo++
			loc := Location{File: name, Line: lineNo}
			if line[len(line)-1] != '\n' {
				if last && rerr == io.EOF {
					rep.TornTail = &loc
					break
				}
				f.Close()
				return rep.broken(loc, "incomplete line in a finished file")
			}
			h.Write(line)
			body := line[:len(line)-1]
			loc.Seq = LineSeq(body)
			canonical, p, hash, ok := lineParts(body)
			if !ok {
				f.Close()
				return rep.broken(loc, "not a chained record (prev/hash tail missing or damaged)")
			}
			if rep.Records == 0 && loc.Seq > 1 && p != Genesis {
				// the oldest files were removed: start from the checkpoint before this one
				if cp, ok := bySeq[loc.Seq-1]; ok && cp.LastHash == p {
					prev, next = p, loc.Seq
					rep.RetainedFiles, rep.AnchoredBy = retainedAway(cps, files, loc.Seq), cp.File
				}
			}
			if p != prev {
				f.Close()
				return rep.broken(loc, fmt.Sprintf("prev %.12s… does not match the previous record's hash %.12s…", p, prev))
			}
			want, err := ChainHash(p, canonical)
			if err != nil || want != hash {
				f.Close()
				return rep.broken(loc, "hash does not match the record's contents (record altered)")
			}
			if loc.Seq != next {
				f.Close()
				return rep.broken(loc, fmt.Sprintf("seq %d where %d was expected", loc.Seq, next))
			}
			if ok, reason := hc.record(loc.Seq, hash); !ok {
				f.Close()
				return rep.broken(loc, reason)
			}
			lastLoc = loc
			if bytes.Contains(canonical, []byte(`"action":"loss"`)) {
				var lr struct {
					Extra struct {
						Lost uint64 `json:"lost"`
					} `json:"extra"`
				}
				if json.Unmarshal(canonical, &lr) == nil {
					rep.Lost += lr.Extra.Lost
				}
			}
			if rep.Records == 0 {
				rep.FirstSeq = loc.Seq
			}
			rep.Records++
			fileRecords++
			prev, next = hash, next+1
			fileLastSeq, fileLastHash = loc.Seq, hash
			rep.LastSeq, rep.LastHash = loc.Seq, hash
			if rerr == io.EOF {
				break
			}
		}
		f.Close()
		cp, ok := byFile[name]
		switch {
		case ok && (cp.LastSeq != fileLastSeq || cp.LastHash != fileLastHash):
			return rep.broken(Location{File: name, Line: lineNo, Seq: fileLastSeq},
				fmt.Sprintf("file ends at seq %d but its checkpoint says %d (records removed or added)", fileLastSeq, cp.LastSeq))
		case ok && cp.FileSHA256 != hex.EncodeToString(h.Sum(nil)):
			return rep.broken(Location{File: name, Line: lineNo, Seq: fileLastSeq}, "file SHA-256 does not match its checkpoint")
		case !ok && !last && fileRecords > 0:
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is finished but has no checkpoint", name))
		}
	}
	for i, c := range cps {
		if rep.Records > 0 && c.LastSeq >= rep.FirstSeq && !slices.Contains(files, c.File) {
			return rep.broken(Location{File: CheckpointFile, Line: i + 1, Seq: c.LastSeq},
				fmt.Sprintf("%s, sealed by this checkpoint, is missing (only the oldest files may be retained away)", c.File))
		}
	}
	if err := hc.end(rep, cps, lastLoc); err != nil {
		return rep, err
	}
	return rep, nil
}

// retainedAway counts the checkpointed files that end before seq and are not in files.
func retainedAway(cps []Checkpoint, files []string, seq uint64) int {
	n := 0
	for _, c := range cps {
		if c.LastSeq < seq && !slices.Contains(files, c.File) {
			n++
		}
	}
	return n
}

func (rep *Report) broken(loc Location, reason string) (*Report, error) {
	rep.Broken = &Break{Location: loc, Reason: reason}
	return rep, fmt.Errorf("%w at %s line %d (seq %d): %s", ErrBroken, loc.File, loc.Line, loc.Seq, reason)
}

func verifySig(pub ed25519.PublicKey, msg []byte, sig string) bool {
	s, err := base64.StdEncoding.DecodeString(sig)
	return err == nil && ed25519.Verify(pub, msg, s)
}
