package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit/record"
)

// Chain format. Each line of a log file is one record:
//
//	<canonical JSON without its closing brace>,"prev":"<64 hex>","hash":"<64 hex>"}\n
//
// The canonical bytes are the record's JSON (field order as in Record, "time" in UTC
// with microseconds, map keys sorted, empty fields omitted) without "prev" and "hash"
// (record.AppendCanonical, Record.Canonical).
// hash = SHA-256(prev as 32 raw bytes || canonical bytes), hex encoded. The first
// record of a log has prev = 64 zeros (Genesis). Verifying needs only the bytes of
// each line: strip the 149-byte tail, append "}", hash.

// Genesis is the prev of the very first record.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// tailLen is the length of `,"prev":"<64>","hash":"<64>"}`.
const tailLen = len(`,"prev":"`) + 64 + len(`","hash":"`) + 64 + len(`"}`)

// ChainHash returns hex(SHA-256(prev raw bytes || canonical)). prev must be 64 hex
// digits.
func ChainHash(prev string, canonical []byte) (string, error) {
	p, err := parseHash(prev)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(p[:])
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// parseHash decodes a chain hash: 64 hex digits.
func parseHash(s string) ([32]byte, error) {
	var p [32]byte
	if len(s) != 64 {
		return p, errors.New("prev is not 64 hex digits")
	}
	if _, err := hex.Decode(p[:], []byte(s)); err != nil {
		return p, errors.New("prev is not 64 hex digits")
	}
	return p, nil
}

// sealer writes chained log lines. It holds the chain's position (the last record's
// hash) and a SHA-256 state reused for every record, so sealing a record into a buffer
// with room allocates nothing. The zero sealer is at Genesis.
type sealer struct {
	prev [32]byte // hash of the last sealed record
	sum  [32]byte // scratch for the next hash
	h    hash.Hash
}

// seal appends r as one log line (with newline) chained to s.prev, and moves s.prev to
// r's hash. On error (an Extra value JSON cannot encode) b and s are unchanged.
func (s *sealer) seal(b []byte, r *Record) ([]byte, error) {
	start := len(b)
	b, err := record.AppendCanonical(b, r)
	if err != nil {
		return b, err
	}
	if s.h == nil {
		s.h = sha256.New()
	}
	s.h.Reset()
	s.h.Write(s.prev[:])
	s.h.Write(b[start:])
	s.h.Sum(s.sum[:0])
	b = append(b[:len(b)-1], `,"prev":"`...) // drop the canonical "}"
	b = hex.AppendEncode(b, s.prev[:])
	b = append(b, `","hash":"`...)
	b = hex.AppendEncode(b, s.sum[:])
	b = append(b, "\"}\n"...)
	s.prev = s.sum
	return b, nil
}

// lineParts splits one log line (without newline) into its canonical bytes, prev and
// hash. ok is false when the line does not have the chain tail.
func lineParts(line []byte) (canonical []byte, prev, hash string, ok bool) {
	if len(line) < tailLen+2 {
		return nil, "", "", false
	}
	tail := line[len(line)-tailLen:]
	if !bytes.HasPrefix(tail, []byte(`,"prev":"`)) || !bytes.Equal(tail[9+64:9+64+10], []byte(`","hash":"`)) ||
		!bytes.HasSuffix(tail, []byte(`"}`)) {
		return nil, "", "", false
	}
	prev, hash = string(tail[9:9+64]), string(tail[9+64+10:9+64+10+64])
	canonical = make([]byte, 0, len(line)-tailLen+1)
	canonical = append(canonical, line[:len(line)-tailLen]...)
	canonical = append(canonical, '}')
	return canonical, prev, hash, true
}

// LineSeq extracts "seq" from a chain line (one JSON Lines record as the writer wrote
// it) without decoding it all; 0 when absent.
func LineSeq(line []byte) uint64 {
	i := bytes.Index(line, []byte(`,"seq":`))
	if i < 0 {
		return 0
	}
	j := i + len(`,"seq":`)
	k := j
	for k < len(line) && line[k] >= '0' && line[k] <= '9' {
		k++
	}
	n, _ := strconv.ParseUint(string(line[j:k]), 10, 64)
	return n
}

// lineTime extracts "time" from a line's start; zero when absent.
func lineTime(line []byte) time.Time {
	const prefix = `{"time":"`
	if !bytes.HasPrefix(line, []byte(prefix)) || len(line) < len(prefix)+27 {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, string(line[len(prefix):len(prefix)+27]))
	if err != nil {
		return time.Time{}
	}
	return t
}
