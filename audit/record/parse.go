package record

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Parse decodes one log line (a record's JSON as the writer writes it: the canonical
// bytes with prev and hash, no newline) into r, which it overwrites: the result and the
// error are exactly those of json.Unmarshal(line, &Record{}). The line as the writer
// writes it (compact, the fields of Record and nothing else, each once) is decoded
// without reflection and without encoding/json's separate validation pass; anything
// else (white space, an unknown or repeated field, a null, a value of the wrong type,
// invalid JSON) is handed to json.Unmarshal, so that the odd line decodes (or fails) as
// it always did. Extra's values are what encoding/json makes of them: float64,
// string, bool, nil, []any and map[string]any.
//
// It is what the readers behind the writer (the OCSF and OTLP exports, Scan, Follow)
// use for every line: encoding/json's reflection was most of their CPU per record.
func Parse(line []byte, r *Record) error {
	p := parser{b: line, s: string(line)}
	if p.record(r) {
		return nil
	}
	*r = Record{}
	return json.Unmarshal(line, r)
}

// maxDepth bounds the nesting of Extra's values the fast path decodes; deeper ones go
// to encoding/json.
const maxDepth = 32

// parser reads one compact JSON record from b; each method reports false, leaving the
// record to encoding/json, at the first byte it does not expect.
type parser struct {
	b []byte
	s string // b as a string: the values without escapes are substrings of it (one allocation per line)
	i int
}

// Bits of the fields seen, to leave a repeated field to encoding/json (which merges a
// repeated "extra" into the first one's map).
const (
	fTime = 1 << iota
	fSeq
	fSandboxID
	fSource
	fProto
	fSrc
	fDstHost
	fDstIP
	fDstPort
	fQType
	fAction
	fMode
	fWouldDeny
	fRule
	fReason
	fPolicyVersion
	fExtra
	fPrev
	fHash
)

// record decodes the whole of p.b into r; false: not the writer's form.
func (p *parser) record(r *Record) bool {
	*r = Record{}
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return p.i == len(p.b)
	}
	var seen uint32
	for {
		key, ok := p.plainString()
		if !ok || !p.byte(':') {
			return false
		}
		var bit uint32
		switch string(key) { // no allocation
		case "time":
			bit = fTime
			var tok []byte
			if tok, ok = p.stringToken(); ok {
				ok = r.Time.UnmarshalJSON(tok) == nil
			}
		case "seq":
			bit = fSeq
			r.Seq, ok = p.uint()
		case "sandbox_id":
			bit = fSandboxID
			r.SandboxID, ok = p.str()
		case "source":
			bit = fSource
			var s string
			s, ok = p.str()
			r.Source = Source(s)
		case "proto":
			bit = fProto
			r.Proto, ok = p.str()
		case "src":
			bit = fSrc
			r.Src, ok = p.str()
		case "dst_host":
			bit = fDstHost
			r.DstHost, ok = p.str()
		case "dst_ip":
			bit = fDstIP
			r.DstIP, ok = p.str()
		case "dst_port":
			bit = fDstPort
			var n int64
			n, ok = p.int()
			r.DstPort = int(n)
		case "qtype":
			bit = fQType
			r.QType, ok = p.str()
		case "action":
			bit = fAction
			r.Action, ok = p.str()
		case "mode":
			bit = fMode
			r.Mode, ok = p.str()
		case "would_deny":
			bit = fWouldDeny
			r.WouldDeny, ok = p.bool()
		case "rule":
			bit = fRule
			r.Rule, ok = p.str()
		case "reason":
			bit = fReason
			r.Reason, ok = p.str()
		case "policy_version":
			bit = fPolicyVersion
			r.PolicyVersion, ok = p.uint()
		case "extra":
			bit = fExtra
			if p.peek() == '{' {
				r.Extra, ok = p.object(0)
			} else {
				ok = false
			}
		case "prev":
			bit = fPrev
			r.Prev, ok = p.str()
		case "hash":
			bit = fHash
			r.Hash, ok = p.str()
		default:
			return false // encoding/json ignores it, or matches it case-insensitively
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if p.byte(',') {
			continue
		}
		return p.byte('}') && p.i == len(p.b)
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

// byte consumes c when it is next.
func (p *parser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// stringToken consumes a JSON string and returns it with its quotes, as it is in b.
func (p *parser) stringToken() ([]byte, bool) {
	tok, _, _, ok := p.scanString()
	return tok, ok
}

// scanString consumes a JSON string: tok is it with its quotes; escaped reports a
// backslash in it, ascii that every byte is below 0x80.
func (p *parser) scanString() (tok []byte, escaped, ascii, ok bool) {
	b, start := p.b, p.i
	if start >= len(b) || b[start] != '"' {
		return nil, false, false, false
	}
	ascii = true
	for i := start + 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			p.i = i + 1
			return b[start:p.i], escaped, ascii, true
		case c == '\\':
			escaped = true
			i++ // the escaped byte; encoding/json checks the escape
		case c < ' ':
			return nil, false, false, false // invalid JSON
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false, false, false
}

// plainString consumes a string without escapes or non-ASCII bytes (a field name)
// and returns its bytes in b.
func (p *parser) plainString() ([]byte, bool) {
	tok, escaped, ascii, ok := p.scanString()
	if !ok || escaped || !ascii {
		return nil, false
	}
	return tok[1 : len(tok)-1], true
}

// str consumes a JSON string and returns its value as encoding/json does.
func (p *parser) str() (string, bool) {
	tok, escaped, ascii, ok := p.scanString()
	if !ok {
		return "", false
	}
	body := tok[1 : len(tok)-1]
	if !escaped && (ascii || utf8.Valid(body)) {
		end := p.i - 1 // the closing quote
		return p.s[end-len(body) : end], true
	}
	// escapes or invalid UTF-8 (replaced by U+FFFD): encoding/json's own unquoting
	var s string
	if json.Unmarshal(tok, &s) != nil {
		return "", false
	}
	return s, true
}

// number consumes a JSON number (RFC 8259 grammar) and returns its text.
func (p *parser) number() ([]byte, bool) {
	b, i := p.b, p.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	p.i = i
	return b[start:i], true
}

// uint consumes a number into a uint64 field, as encoding/json (strconv.ParseUint).
func (p *parser) uint() (uint64, bool) {
	tok, ok := p.number()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(string(tok), 10, 64)
	return n, err == nil
}

// int consumes a number into an int field (64-bit), as encoding/json (strconv.ParseInt).
func (p *parser) int() (int64, bool) {
	tok, ok := p.number()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(tok), 10, strconv.IntSize)
	return n, err == nil
}

// bool consumes true or false.
func (p *parser) bool() (bool, bool) {
	if p.literal("true") {
		return true, true
	}
	return false, p.literal("false")
}

func (p *parser) literal(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// value consumes any JSON value as encoding/json decodes it into an interface.
func (p *parser) value(depth int) (any, bool) {
	switch c := p.peek(); {
	case c == '"':
		return p.str()
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == 't' || c == 'f':
		return p.bool()
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		tok, ok := p.number()
		if !ok {
			return nil, false
		}
		f, err := strconv.ParseFloat(string(tok), 64)
		return f, err == nil
	}
	return nil, false
}

// object consumes a JSON object into a map (later keys replace earlier ones).
func (p *parser) object(depth int) (map[string]any, bool) {
	if depth > maxDepth || !p.byte('{') {
		return nil, false
	}
	m := make(map[string]any, 8)
	if p.byte('}') {
		return m, true
	}
	for {
		k, ok := p.str()
		if !ok || !p.byte(':') {
			return nil, false
		}
		if m[k], ok = p.value(depth); !ok {
			return nil, false
		}
		if p.byte(',') {
			continue
		}
		return m, p.byte('}')
	}
}

// array consumes a JSON array into a []any (empty, not nil, for []).
func (p *parser) array(depth int) ([]any, bool) {
	if depth > maxDepth || !p.byte('[') {
		return nil, false
	}
	a := make([]any, 0, 4)
	if p.byte(']') {
		return a, true
	}
	for {
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		if p.byte(',') {
			continue
		}
		return a, p.byte(']')
	}
}
