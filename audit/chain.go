package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// Chain format. Each line of a log file is one record:
//
//	<canonical JSON without its closing brace>,"prev":"<64 hex>","hash":"<64 hex>"}\n
//
// The canonical bytes are the record's JSON (field order as in Record, "time" in UTC
// with microseconds, map keys sorted, empty fields omitted) without "prev" and "hash".
// hash = SHA-256(prev as 32 raw bytes || canonical bytes), hex encoded. The first
// record of a log has prev = 64 zeros (Genesis). Verifying needs only the bytes of
// each line: strip the 149-byte tail, append "}", hash.

// Genesis is the prev of the very first record.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// TimeFormat is how "time" is written: RFC 3339, UTC, microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// tailLen is the length of `,"prev":"<64>","hash":"<64>"}`.
const tailLen = len(`,"prev":"`) + 64 + len(`","hash":"`) + 64 + len(`"}`)

// canonicalRecord is Record without the chain fields and with a fixed time format.
type canonicalRecord struct {
	Time          string         `json:"time"`
	Seq           uint64         `json:"seq"`
	SandboxID     string         `json:"sandbox_id,omitempty"`
	Source        Source         `json:"source"`
	Proto         string         `json:"proto,omitempty"`
	Src           string         `json:"src,omitempty"`
	DstHost       string         `json:"dst_host,omitempty"`
	DstIP         string         `json:"dst_ip,omitempty"`
	DstPort       int            `json:"dst_port,omitempty"`
	QType         string         `json:"qtype,omitempty"`
	Action        string         `json:"action"`
	Mode          string         `json:"mode,omitempty"`
	WouldDeny     bool           `json:"would_deny,omitempty"`
	Rule          string         `json:"rule,omitempty"`
	Reason        string         `json:"reason,omitempty"`
	PolicyVersion uint64         `json:"policy_version,omitempty"`
	Extra         map[string]any `json:"extra,omitempty"`
}

// Canonical returns the record's canonical bytes (see the chain format above).
func (r Record) Canonical() ([]byte, error) {
	return json.Marshal(canonicalRecord{
		Time: r.Time.UTC().Format(TimeFormat), Seq: r.Seq, SandboxID: r.SandboxID, Source: r.Source,
		Proto: r.Proto, Src: r.Src, DstHost: r.DstHost, DstIP: r.DstIP, DstPort: r.DstPort, QType: r.QType,
		Action: r.Action, Mode: r.Mode, WouldDeny: r.WouldDeny, Rule: r.Rule, Reason: r.Reason,
		PolicyVersion: r.PolicyVersion, Extra: r.Extra,
	})
}

// MarshalJSON writes the record exactly as a log line (without the newline): the
// canonical bytes followed by prev and hash.
func (r Record) MarshalJSON() ([]byte, error) {
	c, err := r.Canonical()
	if err != nil {
		return nil, err
	}
	return appendChain(c[:len(c)-1], r.Prev, r.Hash), nil
}

func appendChain(b []byte, prev, hash string) []byte {
	b = append(b, `,"prev":"`...)
	b = append(b, prev...)
	b = append(b, `","hash":"`...)
	b = append(b, hash...)
	return append(b, `"}`...)
}

// ChainHash returns hex(SHA-256(prev raw bytes || canonical)). prev must be 64 hex
// digits.
func ChainHash(prev string, canonical []byte) (string, error) {
	var p [32]byte
	if _, err := hex.Decode(p[:], []byte(prev)); err != nil || len(prev) != 64 {
		return "", errors.New("prev is not 64 hex digits")
	}
	h := sha256.New()
	h.Write(p[:])
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// seal encodes r as one log line (with newline) chained to prev, returning the line and
// r's hash.
func seal(r *Record, prev string) ([]byte, error) {
	c, err := r.Canonical()
	if err != nil {
		return nil, err
	}
	hash, err := ChainHash(prev, c)
	if err != nil {
		return nil, err
	}
	r.Prev, r.Hash = prev, hash
	line := appendChain(c[:len(c)-1], prev, hash)
	return append(line, '\n'), nil
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

// lineSeq extracts "seq" from a line without decoding it all; 0 when absent.
func lineSeq(line []byte) uint64 {
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
