package record

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// canonicalRecord is Record without the chain fields and with a fixed time format. Its
// json.Marshal output is the definition of the canonical bytes; AppendCanonical writes
// the same bytes without reflection and falls back to it only for an Extra value
// encoding/json cannot encode (so that the error is encoding/json's own).
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

// marshalCanonical is the reference encoding: json.Marshal of canonicalRecord.
func marshalCanonical(r *Record) ([]byte, error) {
	return json.Marshal(canonicalRecord{
		Time: r.Time.UTC().Format(TimeFormat), Seq: r.Seq, SandboxID: r.SandboxID, Source: r.Source,
		Proto: r.Proto, Src: r.Src, DstHost: r.DstHost, DstIP: r.DstIP, DstPort: r.DstPort, QType: r.QType,
		Action: r.Action, Mode: r.Mode, WouldDeny: r.WouldDeny, Rule: r.Rule, Reason: r.Reason,
		PolicyVersion: r.PolicyVersion, Extra: r.Extra,
	})
}

// Canonical returns the record's canonical bytes (see AppendCanonical). The error, when
// an Extra value cannot be encoded as JSON, is encoding/json's.
func (r Record) Canonical() ([]byte, error) {
	return AppendCanonical(make([]byte, 0, 512), &r)
}

// MarshalJSON writes the record exactly as a line of the audit log (without the
// newline): the canonical bytes followed by prev and hash.
func (r Record) MarshalJSON() ([]byte, error) {
	c, err := AppendCanonical(make([]byte, 0, 512+160), &r)
	if err != nil {
		return nil, err
	}
	c = append(c[:len(c)-1], `,"prev":"`...) // drop the canonical "}"
	c = append(c, r.Prev...)
	c = append(c, `","hash":"`...)
	c = append(c, r.Hash...)
	return append(c, `"}`...), nil
}

// AppendCanonical appends r's canonical bytes to b: exactly what marshalCanonical
// returns, field by field (the record's JSON, field order as in Record, "time" in UTC
// with microseconds per TimeFormat, map keys sorted, empty fields omitted, without the
// chain fields prev and hash). Extra values of the types the data path uses (string, bool,
// integers, floats, []string, nil) are written directly, its keys sorted; any other
// value is encoded by json.Marshal on its own, which writes it as it would inside the
// record. The error, when a value cannot be encoded, is marshalCanonical's; b is then
// returned unchanged.
func AppendCanonical(b []byte, r *Record) ([]byte, error) {
	start := len(b)
	b = append(b, `{"time":"`...)
	b = r.Time.UTC().AppendFormat(b, TimeFormat) // digits, '-', ':', 'T', '.', 'Z': nothing to escape
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = appendField(b, `,"sandbox_id":`, r.SandboxID)
	b = append(b, `,"source":`...)
	b = appendString(b, string(r.Source))
	b = appendField(b, `,"proto":`, r.Proto)
	b = appendField(b, `,"src":`, r.Src)
	b = appendField(b, `,"dst_host":`, r.DstHost)
	b = appendField(b, `,"dst_ip":`, r.DstIP)
	if r.DstPort != 0 {
		b = append(b, `,"dst_port":`...)
		b = strconv.AppendInt(b, int64(r.DstPort), 10)
	}
	b = appendField(b, `,"qtype":`, r.QType)
	b = append(b, `,"action":`...)
	b = appendString(b, r.Action)
	b = appendField(b, `,"mode":`, r.Mode)
	if r.WouldDeny {
		b = append(b, `,"would_deny":true`...)
	}
	b = appendField(b, `,"rule":`, r.Rule)
	b = appendField(b, `,"reason":`, r.Reason)
	if r.PolicyVersion != 0 {
		b = append(b, `,"policy_version":`...)
		b = strconv.AppendUint(b, r.PolicyVersion, 10)
	}
	if len(r.Extra) > 0 {
		b = append(b, `,"extra":`...)
		var ok bool
		if b, ok = appendExtra(b, r.Extra); !ok {
			c, err := marshalCanonical(r)
			if err != nil {
				return b[:start], err
			}
			return append(b[:start], c...), nil // not reached: a value that failed alone fails in the record
		}
	}
	return append(b, '}'), nil
}

// appendField appends name and s as a JSON string unless s is empty (omitempty).
func appendField(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, name...), s)
}

// extraField is one Extra entry, for sorting by key.
type extraField struct {
	k string
	v any
}

// appendExtra appends m as a JSON object with sorted keys, as encoding/json does; ok is
// false when a value cannot be encoded.
func appendExtra(b []byte, m map[string]any) (_ []byte, ok bool) {
	var stack [16]extraField // the data path's Extra has at most ~10 keys
	fields := stack[:0]
	for k, v := range m {
		fields = append(fields, extraField{k, v})
	}
	slices.SortFunc(fields, func(x, y extraField) int { return strings.Compare(x.k, y.k) })
	b = append(b, '{')
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, f.k)
		b = append(b, ':')
		if b, ok = appendValue(b, f.v); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendValue appends v as encoding/json would: directly for the built-in types the
// data path uses, through json.Marshal for anything else; ok is false when v cannot
// be encoded.
func appendValue(b []byte, v any) (_ []byte, ok bool) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendString(b, v), true
	case bool:
		return strconv.AppendBool(b, v), true
	case int:
		return strconv.AppendInt(b, int64(v), 10), true
	case int8:
		return strconv.AppendInt(b, int64(v), 10), true
	case int16:
		return strconv.AppendInt(b, int64(v), 10), true
	case int32:
		return strconv.AppendInt(b, int64(v), 10), true
	case int64:
		return strconv.AppendInt(b, v, 10), true
	case uint:
		return strconv.AppendUint(b, uint64(v), 10), true
	case uint8:
		return strconv.AppendUint(b, uint64(v), 10), true
	case uint16:
		return strconv.AppendUint(b, uint64(v), 10), true
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10), true
	case uint64:
		return strconv.AppendUint(b, v, 10), true
	case float64:
		if !math.IsInf(v, 0) && !math.IsNaN(v) {
			return appendFloat(b, v, 64), true
		}
	case float32:
		if f := float64(v); !math.IsInf(f, 0) && !math.IsNaN(f) {
			return appendFloat(b, f, 32), true
		}
	case []string:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		return append(b, ']'), true
	}
	j, err := json.Marshal(v)
	if err != nil {
		return b, false
	}
	return append(b, j...), true
}

// AppendFloat64 appends f as encoding/json writes a float64 (appendFloat); f must be
// finite (encoding/json refuses NaN and ±Inf). audit/ocsf writes the numbers of
// records read back (float64 all) with it.
func AppendFloat64(b []byte, f float64) []byte { return appendFloat(b, f, 64) }

// appendFloat is encoding/json's float encoding (ES6 number to string): 'f' format,
// 'e' below 1e-6 and from 1e21, exponents without leading zeros. f is finite.
func appendFloat(b []byte, f float64, bits int) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' { // e-09 -> e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// htmlSafe[c] is true for the ASCII bytes encoding/json writes as they are (it escapes
// control characters, '"', '\\', and, for HTML, '<', '>' and '&').
var htmlSafe = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = !strings.ContainsRune(`"\<>&`, c)
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string exactly as encoding/json (with HTML escaping)
// writes it: \" \\ \b \f \n \r \t, other control characters and < > & as \u00XX,
// U+2028 and U+2029 as \u2028 and \u2029, each byte of invalid UTF-8 as \ufffd.
func appendString(b []byte, s string) []byte {
	return append(AppendEscaped(append(b, '"'), s), '"')
}

// AppendEscaped appends s escaped for the inside of a JSON string (no quotes), the way
// appendString does: the one JSON string escaper of the audit packages (audit/ocsf
// uses it too).
func AppendEscaped(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if htmlSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}
