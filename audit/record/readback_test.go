package record

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"
)

// parsed is r as Parse reads it from its canonical bytes: what ReadBack must equal.
func parsed(t *testing.T, r *Record) Record {
	t.Helper()
	b, err := AppendCanonical(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	var out Record
	if err := Parse(b, &out); err != nil {
		t.Fatalf("parse %s: %v", b, err)
	}
	out.Prev, out.Hash = r.Prev, r.Hash
	return out
}

// TestReadBack: for records with every kind of value the writers put in a record,
// ReadBack equals encoding and parsing, and leaves the record alone.
func TestReadBack(t *testing.T) {
	loc := time.FixedZone("X", 3600)
	base := Record{Time: time.Date(2026, 11, 27, 11, 8, 48, 123456789, loc), Seq: 42, SandboxID: "sbx", Source: "gateway",
		Proto: "http", Src: "127.0.0.1:5", DstHost: "h.example", DstIP: "10.0.0.1", DstPort: 8080, Action: "allow",
		Rule: "access:public", Reason: "public", PolicyVersion: 3, Prev: "p", Hash: "h"}
	type point struct{ X, Y int }
	extras := []map[string]any{
		nil,
		{},
		{"status": 200, "bytes": int64(5), "duration_ms": 0.512, "method": "GET", "upgrade": ""},
		{"i8": int8(-3), "i16": int16(300), "i32": int32(-70000), "u": uint(7), "u8": uint8(255), "u16": uint16(65535),
			"u32": uint32(1 << 31), "u64": uint64(math.MaxUint64), "i64": int64(math.MaxInt64), "big": int64(1<<53 + 1)},
		{"b": true, "nil": nil, "neg0": math.Copysign(0, -1), "f": 1e21, "tiny": 5e-324},
		{"args": []string{"curl", "-s", "https://x"}, "none": []string(nil), "empty": []string{}},
		{"process": map[string]any{"pid": 12, "exe": "python3", "args": []string{"-c", "x"}, "parent": map[string]any{"pid": int32(1)}},
			"list": []any{1, "a", []any{uint16(2)}, map[string]any{"k": int64(3)}}, "nilmap": map[string]any(nil), "nilslice": []any(nil)},
		{"f32": float32(0.1)},                             // encoded as float32's shortest form
		{"struct": point{1, 2}},                           // through json.Marshal
		{"raw": json.RawMessage(`{"a":1}`)},               // through json.Marshal
		{"bad": "a\xffb", "sep": "line\u2028sep"},         // invalid UTF-8
		{"bad\xfekey": 1},                                 // invalid UTF-8 key
		{"nested": map[string]any{"v": []string{"\xff"}}}, // invalid deep down
	}
	for i, ex := range extras {
		r := base
		r.Extra = ex
		before, _ := AppendCanonical(nil, &r)
		got, want := ReadBack(&r), parsed(t, &r)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("extra %d: ReadBack\n%#v\nParse\n%#v", i, got, want)
		}
		if after, _ := AppendCanonical(nil, &r); string(after) != string(before) {
			t.Errorf("extra %d: ReadBack changed the record", i)
		}
	}
	// The fixed fields.
	for i, mod := range []func(*Record){
		func(r *Record) { r.Time = time.Time{} },
		func(r *Record) { r.Time = time.Date(1969, 12, 31, 23, 59, 59, 999, time.UTC) },
		func(r *Record) { r.Time = time.Now() }, // monotonic reading
		func(r *Record) { r.DstHost = "caf\xe9" },
		func(r *Record) { r.Reason = "a\"b\\c\n<&>" },
	} {
		r := base
		mod(&r)
		if got, want := ReadBack(&r), parsed(t, &r); !reflect.DeepEqual(got, want) {
			t.Errorf("fields %d: ReadBack\n%#v\nParse\n%#v", i, got, want)
		}
	}
}
