package record

import (
	"maps"
	"math"
	"time"
	"unicode/utf8"
)

// ReadBack returns r as Parse reads it back from its canonical bytes (AppendCanonical),
// without encoding and parsing it when it need not: "time" in UTC cut to microseconds
// (TimeFormat), Extra's numbers as float64, []string as []any, an empty Extra as nil,
// Prev and Hash as r has them. So an export fed the writer's records in memory sees
// what it would read from the chain (audit/ocsf). A record with anything else (a
// string that is not valid UTF-8, a float32, a value of another type) is encoded and
// parsed, which is exact by definition. r is not changed; the result shares r's strings
// and, when no value needs converting, r's Extra map (read-only).
func ReadBack(r *Record) Record {
	if y := r.Time.Year(); y < 1970 || y > 2200 { // outside what UnixNano holds
		return parseBack(r)
	}
	out := *r
	out.Time = time.Unix(0, r.Time.UnixNano()/1e3*1e3).UTC()
	for _, s := range [...]string{r.SandboxID, string(r.Source), r.Proto, r.Src, r.DstHost, r.DstIP, r.QType, r.Action,
		r.Mode, r.Rule, r.Reason} {
		if !utf8.ValidString(s) {
			return parseBack(r)
		}
	}
	if len(r.Extra) == 0 {
		out.Extra = nil
		return out
	}
	cloned := false
	for k, v := range r.Extra {
		if !utf8.ValidString(k) {
			return parseBack(r)
		}
		nv, changed, ok := readBackValue(v, 0)
		if !ok {
			return parseBack(r)
		}
		if changed {
			if !cloned {
				out.Extra, cloned = maps.Clone(r.Extra), true
			}
			out.Extra[k] = nv
		}
	}
	return out
}

// parseBack is ReadBack the exact way: encode and parse. A record that does not encode
// is returned as it is (the writer never hands one on: it records the error instead).
func parseBack(r *Record) Record {
	b, err := AppendCanonical(nil, r)
	if err != nil {
		return *r
	}
	var out Record
	if err := Parse(b, &out); err != nil {
		return *r
	}
	out.Prev, out.Hash = r.Prev, r.Hash
	return out
}

// readBackValue is v as Parse reads it back: changed when that differs from v (a new
// value; v is not modified); ok false when only encoding and parsing can tell.
func readBackValue(v any, depth int) (_ any, changed, ok bool) {
	if depth > maxDepth {
		return nil, false, false
	}
	// Unchanged values are returned as v itself: boxing them again would allocate.
	switch x := v.(type) {
	case nil, bool:
		return v, false, true
	case string:
		return v, false, utf8.ValidString(x)
	case float64:
		return v, false, !math.IsInf(x, 0) && !math.IsNaN(x)
	// An integer's decimal parsed as float64 rounds as the conversion does (to nearest,
	// ties to even).
	case int:
		return float64(x), true, true
	case int8:
		return float64(x), true, true
	case int16:
		return float64(x), true, true
	case int32:
		return float64(x), true, true
	case int64:
		return float64(x), true, true
	case uint:
		return float64(x), true, true
	case uint8:
		return float64(x), true, true
	case uint16:
		return float64(x), true, true
	case uint32:
		return float64(x), true, true
	case uint64:
		return float64(x), true, true
	case []string:
		if x == nil {
			return nil, true, true
		}
		out := make([]any, len(x))
		for i, s := range x {
			if !utf8.ValidString(s) {
				return nil, false, false
			}
			out[i] = s
		}
		return out, true, true
	case []any:
		if x == nil {
			return nil, true, true
		}
		var out []any
		for i, e := range x {
			ne, ch, ok := readBackValue(e, depth+1)
			if !ok {
				return nil, false, false
			}
			if ch && out == nil {
				out = append(make([]any, 0, len(x)), x[:i]...)
			}
			if out != nil {
				out = append(out, ne)
			}
		}
		if out == nil {
			return v, false, true
		}
		return out, true, true
	case map[string]any:
		if x == nil {
			return nil, true, true
		}
		var out map[string]any
		for k, e := range x {
			if !utf8.ValidString(k) {
				return nil, false, false
			}
			ne, ch, ok := readBackValue(e, depth+1)
			if !ok {
				return nil, false, false
			}
			if ch && out == nil {
				out = maps.Clone(x)
			}
			if out != nil {
				out[k] = ne
			}
		}
		if out == nil {
			return v, false, true
		}
		return out, true, true
	}
	return nil, false, false
}
