package ocsf

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"

	"github.com/airlockdev/airlock/audit/record"
)

// jw appends one JSON value to b in the order its keys are given: the events are
// written without reflection, so that exporting costs the writer's host little.
type jw struct {
	b     []byte
	comma bool // a value precedes: the next key or element needs a comma
}

func (w *jw) sep() {
	if w.comma {
		w.b = append(w.b, ',')
	}
	w.comma = true
}

func (w *jw) key(k string) {
	w.sep()
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

// str writes k: v unless v is empty.
func (w *jw) str(k, v string) {
	if v == "" {
		return
	}
	w.key(k)
	w.b = appendString(w.b, v)
}

func (w *jw) int(k string, v int64) {
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *jw) bool(k string, v bool) {
	w.key(k)
	w.b = strconv.AppendBool(w.b, v)
}

// open starts the object k ("" for an array element or the top level).
func (w *jw) open(k string) {
	if k == "" {
		w.sep()
	} else {
		w.key(k)
	}
	w.b = append(w.b, '{')
	w.comma = false
}

func (w *jw) close() {
	w.b = append(w.b, '}')
	w.comma = true
}

// array starts the array k.
func (w *jw) array(k string) {
	w.key(k)
	w.b = append(w.b, '[')
	w.comma = false
}

func (w *jw) end() {
	w.b = append(w.b, ']')
	w.comma = true
}

// elem writes one string element of an array.
func (w *jw) elem(s string) {
	w.sep()
	w.b = appendString(w.b, s)
}

// value writes k: v (the unmapped extras): strings, numbers, booleans, lists and maps
// (keys sorted) directly, anything else as encoding/json does; a value it cannot
// encode is written as its error text.
func (w *jw) value(k string, v any) {
	w.key(k)
	w.b = appendValue(w.b, v, 0)
}

func appendValue(b []byte, v any, depth int) []byte {
	switch v := v.(type) {
	case string:
		return appendString(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case uint64:
		return strconv.AppendUint(b, v, 10)
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10)
	case bool:
		return strconv.AppendBool(b, v)
	case float64: // every number of a record read back from the chain
		if !math.IsInf(v, 0) && !math.IsNaN(v) {
			return record.AppendFloat64(b, v)
		}
	case []string:
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		return append(b, ']')
	case []any:
		if depth > 8 {
			break
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, e, depth+1)
		}
		return append(b, ']')
	case map[string]any:
		if depth > 8 {
			break
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendValue(b, v[k], depth+1)
		}
		return append(b, '}')
	}
	j, err := json.Marshal(v)
	if err != nil {
		j = appendString(nil, "unencodable: "+err.Error())
	}
	return append(b, j...)
}

// appendString appends s as a JSON string (record.AppendEscaped: invalid UTF-8 becomes
// U+FFFD).
func appendString(b []byte, s string) []byte {
	return append(record.AppendEscaped(append(b, '"'), s), '"')
}
