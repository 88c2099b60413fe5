package audit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Findings of VerifyAnchors (AnchorReport.Finding).
const (
	// FindingOK: the log agrees with every anchor (what retention removed aside).
	FindingOK = "ok"
	// FindingRewritten: a checkpoint or record the anchors name has another hash on
	// the host (the chain was rewritten, hashes recomputed).
	FindingRewritten = "rewritten"
	// FindingTruncated: the anchors name records or checkpoints past the log's end.
	FindingTruncated = "truncated"
	// FindingLogBroken: the log disagrees with no anchor but does not verify by itself.
	FindingLogBroken = "log broken"
	// FindingAnchorsBroken: the anchors themselves do not chain or verify.
	FindingAnchorsBroken = "anchors broken"
)

// AnchorReport is what VerifyAnchors found.
type AnchorReport struct {
	// Log is Verify's report of the log on the host; LogError its error, if any.
	Log      *Report `json:"log"`
	LogError string  `json:"log_error,omitempty"`
	// Anchors counts the anchors read; Checked those compared with the log;
	// Retained those naming only records retention removed (expected).
	Anchors  int `json:"anchors"`
	Checked  int `json:"checked"`
	Retained int `json:"retained"`
	// LastSeq and LastTime are the latest anchor's: the log must reach LastSeq.
	LastSeq  uint64    `json:"last_seq"`
	LastTime time.Time `json:"last_time,omitzero"`
	// Finding is one of the Finding* constants.
	Finding string `json:"finding"`
	// RewrittenFile is the first log file whose records differ from the anchors (its
	// checkpoint is the first rewritten one; the active file when none seals it).
	RewrittenFile string `json:"rewritten_file,omitempty"`
	// Broken says where and why, nil when Finding is FindingOK.
	Broken *Break `json:"broken,omitempty"`
}

// VerifyAnchors checks the log in dir against anchors shipped off the host (a
// DirSink's ReadAnchors): the anchors' own chain (each names the previous one's
// digest; signatures with opts.PublicKey), then Verify(dir, opts), then every anchor
// against the log: a checkpoint anchor must match the host's checkpoint of that file
// (hash, last seq and hash, file SHA-256), a head anchor the record at its seq. A
// mismatch is FindingRewritten (naming the first rewritten checkpoint), an anchor past
// the log's end FindingTruncated (even when an older signed head was put back), and
// anchors of files retention removed are counted in Retained. The error wraps
// ErrBroken unless Finding is FindingOK.
func VerifyAnchors(dir string, anchors []Anchor, opts VerifyOptions) (*AnchorReport, error) {
	ar := &AnchorReport{Anchors: len(anchors), Finding: FindingOK}
	prev := Genesis
	for i, a := range anchors {
		loc := Location{File: AnchorFile, Line: i + 1, Seq: a.LastSeq}
		var reason string
		switch {
		case a.Prev != prev:
			reason = "the anchor does not name the previous anchor's digest (anchors removed or inserted in the sink)"
		case a.computeDigest() != a.Digest:
			reason = "the anchor's digest does not match its contents"
		case opts.PublicKey != nil && a.Sig == "":
			reason = "the anchor is not signed but a public key was given"
		case opts.PublicKey != nil && !verifySig(opts.PublicKey, mustHex(a.Digest), a.Sig):
			reason = "the anchor's signature does not verify with the given public key"
		}
		if reason != "" {
			return ar.broken(FindingAnchorsBroken, loc, reason)
		}
		prev = a.Digest
		if a.LastSeq >= ar.LastSeq {
			ar.LastSeq, ar.LastTime = a.LastSeq, a.Time
		}
	}
	rep, verr := Verify(dir, opts)
	if rep == nil {
		return ar, verr
	}
	ar.Log = rep
	if verr != nil {
		ar.LogError = verr.Error()
		if !errors.Is(verr, ErrBroken) {
			return ar, verr
		}
	}
	cps, err := ReadCheckpoints(dir)
	if err != nil && len(cps) == 0 {
		return ar, err
	}
	first, last, hashes, err := recordHashes(dir, anchors)
	if err != nil {
		return ar, err
	}
	files, err := logFiles(dir)
	if err != nil {
		return ar, err
	}
	// the first anchor that disagrees with the log, by seq
	var bad *Anchor
	var badReason string
	truncated := -1
	for i := range anchors {
		a := &anchors[i]
		if a.LastSeq == 0 {
			ar.Checked++
			continue
		}
		reason := ""
		switch a.Kind {
		case AnchorCheckpoint:
			j := slices.IndexFunc(cps, func(c Checkpoint) bool { return c.File == a.File })
			switch {
			case j < 0 && a.LastSeq > last:
				truncated = i
				continue
			case j < 0:
				reason = fmt.Sprintf("%s no longer holds the anchored checkpoint of %s", CheckpointFile, a.File)
			case cps[j].Hash != a.Checkpoint || cps[j].LastSeq != a.LastSeq || cps[j].LastHash != a.LastHash || cps[j].FileSHA256 != a.FileSHA256:
				reason = fmt.Sprintf("the checkpoint of %s is not the anchored one (anchored %.12s…, on the host %.12s…)", a.File, a.Checkpoint, cps[j].Hash)
			case !slices.Contains(files, a.File) && (rep.Records == 0 || a.LastSeq < first):
				ar.Retained++
				continue
			}
		default:
			h, ok := hashes[a.LastSeq]
			switch {
			case a.LastSeq > last:
				truncated = i
				continue
			case !ok && a.LastSeq < first:
				ar.Retained++
				continue
			case !ok:
				reason = fmt.Sprintf("record %d, named by a head anchor, is not in the log", a.LastSeq)
			case h != a.LastHash:
				reason = fmt.Sprintf("record %d's hash is not the one anchored (anchored %.12s…, on the host %.12s…)", a.LastSeq, a.LastHash, h)
			}
		}
		if reason != "" {
			if bad == nil || a.LastSeq < bad.LastSeq {
				bad, badReason = a, reason
			}
			continue
		}
		ar.Checked++
	}
	switch {
	case bad != nil:
		// the first checkpoint sealing a rewritten record is the first rewritten one
		j := slices.IndexFunc(cps, func(c Checkpoint) bool { return c.LastSeq >= bad.LastSeq })
		if j >= 0 {
			ar.RewrittenFile = cps[j].File
			return ar.broken(FindingRewritten, Location{File: CheckpointFile, Line: j + 1, Seq: cps[j].LastSeq},
				fmt.Sprintf("rewritten: the first rewritten checkpoint is line %d, sealing %s (seq %d..%d): %s",
					j+1, cps[j].File, cps[j].FirstSeq, cps[j].LastSeq, badReason))
		}
		if len(files) > 0 {
			ar.RewrittenFile = files[len(files)-1]
		}
		return ar.broken(FindingRewritten, Location{File: ar.RewrittenFile, Seq: bad.LastSeq},
			fmt.Sprintf("rewritten after the last checkpoint, in %s: %s", ar.RewrittenFile, badReason))
	case truncated >= 0:
		a := anchors[truncated]
		return ar.broken(FindingTruncated, Location{File: AnchorFile, Line: truncated + 1, Seq: a.LastSeq},
			fmt.Sprintf("truncated: the log ends at seq %d but an anchor shipped %s names seq %d",
				last, a.Time.Format(time.RFC3339), ar.LastSeq))
	case verr != nil:
		ar.Finding, ar.Broken = FindingLogBroken, rep.Broken
		return ar, verr
	}
	return ar, nil
}

func (ar *AnchorReport) broken(finding string, loc Location, reason string) (*AnchorReport, error) {
	ar.Finding, ar.Broken = finding, &Break{Location: loc, Reason: reason}
	return ar, fmt.Errorf("%w: %s: %s", ErrBroken, finding, reason)
}

func mustHex(s string) []byte {
	b, _ := parseHash(s)
	return b[:]
}

// recordHashes reads the log's records: the first and last seq, and the hash of each
// record a head anchor names.
func recordHashes(dir string, anchors []Anchor) (first, last uint64, hashes map[uint64]string, err error) {
	want := map[uint64]bool{}
	for _, a := range anchors {
		if a.Kind == AnchorHead {
			want[a.LastSeq] = true
		}
	}
	hashes = map[uint64]string{}
	files, err := logFiles(dir)
	if err != nil {
		return 0, 0, nil, err
	}
	for _, name := range files {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return 0, 0, nil, err
		}
		r := bufio.NewReaderSize(f, 1<<20)
		for {
			line, rerr := r.ReadBytes('\n')
			if len(line) > 0 && line[len(line)-1] == '\n' {
				body := line[:len(line)-1]
				seq := LineSeq(body)
				if first == 0 {
					first = seq
				}
				last = max(last, seq)
				if want[seq] {
					if _, _, h, ok := lineParts(body); ok {
						hashes[seq] = h
					}
				}
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				f.Close()
				return 0, 0, nil, rerr
			}
		}
		f.Close()
	}
	return first, last, hashes, nil
}
