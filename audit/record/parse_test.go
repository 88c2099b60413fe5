package record

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// checkParse fails t unless Parse(line) gives json.Unmarshal's record and error; it
// reports whether Parse took its own path (no fallback).
func checkParse(t testing.TB, line []byte) (fast bool) {
	t.Helper()
	var want Record
	werr := json.Unmarshal(line, &want)
	got := Record{Seq: 99, Extra: map[string]any{"stale": true}} // Parse overwrites
	err := Parse(line, &got)
	if (err != nil) != (werr != nil) || err != nil && err.Error() != werr.Error() {
		t.Fatalf("line %q:\nerror %v\nwant  %v", line, err, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("line %q:\ngot  %#v\nwant %#v", line, got, want)
	}
	var r Record
	p := parser{b: line, s: string(line)}
	return p.record(&r)
}

// logLine is r as the writer writes it: canonical bytes, prev and hash.
func logLine(t testing.TB, r Record) []byte {
	t.Helper()
	b, err := r.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestParseMatchesJSON: random records (every string escape class, invalid UTF-8, every
// Extra value type as written, nested maps and arrays), their lines mutated byte by
// byte, and hand-made odd lines all decode as json.Unmarshal decodes them, with its
// errors; the writer's own lines take the fast path.
func TestParseMatchesJSON(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	var fast, lines int
	for range 30_000 {
		r := randRecord(rng, false)
		r.Prev, r.Hash = strings.Repeat("a", 64), strings.Repeat("0", 64)
		line, err := r.MarshalJSON()
		if err != nil {
			continue
		}
		if json.Unmarshal(line, new(Record)) == nil { // not a year outside 0..9999
			lines++
			if checkParse(t, line) {
				fast++
			}
		} else {
			checkParse(t, line)
		}
		for range 3 { // a damaged copy: a byte changed, dropped or doubled
			m := append([]byte(nil), line...)
			i := rng.IntN(len(m))
			switch rng.IntN(3) {
			case 0:
				m[i] = `{}[]":,\ 0-.eE9tfnul"`[rng.IntN(21)]
			case 1:
				m = append(m[:i], m[i+1:]...)
			default:
				m = append(m[:i+1], m[i:]...)
			}
			checkParse(t, m)
		}
	}
	t.Logf("%d lines, %d on the fast path", lines, fast)
	if fast != lines {
		t.Errorf("%d of %d of the writer's lines fell back to encoding/json", lines-fast, lines)
	}

	odd := []string{
		``, `{}`, `[]`, `null`, `{`, `{"seq":1}x`, `{"seq":1} `, ` {"seq":1}`, `{"seq" :1}`, `{"seq":1,}`,
		`{"Seq":1}`, `{"SEQ":2,"seq":1}`, `{"seq":1,"seq":2}`, `{"unknown":1,"seq":2}`, `{"seq":null}`,
		`{"seq":-1}`, `{"seq":1.0}`, `{"seq":1e2}`, `{"seq":01}`, `{"seq":18446744073709551616}`, `{"seq":"1"}`,
		`{"dst_port":-443}`, `{"dst_port":9223372036854775808}`, `{"dst_port":-0}`,
		`{"time":"2026-03-04T04:06:07.123456Z"}`, `{"time":"2026-03-04T04:06:07Z"}`, `{"time":"2026-03-04T04:06:07+02:00"}`,
		`{"time":"2026-13-04T04:06:07Z"}`, `{"time":null}`, `{"time":1}`, `{"time":"2026-03-04T04:06:07\u002e1Z"}`,
		`{"source":"dns","action":"allow","would_deny":true}`, `{"would_deny":1}`, `{"would_deny":nul}`,
		`{"reason":"a\"b\\c\u00e9\ud83d\ude00\n"}`, `{"reason":"\ud800"}`, `{"reason":"\x"}`, "{\"reason\":\"a\x01\"}",
		"{\"reason\":\"\xff\xfe\"}", `{"reason":"é中😀"}`, `{"sandbox_id":"a","sandbox_id":"b"}`,
		`{"extra":null}`, `{"extra":{}}`, `{"extra":[]}`, `{"extra":1}`, `{"extra":{"a":1},"extra":{"b":2}}`,
		`{"extra":{"a":1,"a":2}}`, `{"extra":{"a":[]}}`, `{"extra":{"a":[1,"x",null,true,false,{"b":[{}]}]}}`,
		`{"extra":{"n":-0,"f":1.5e-7,"g":1E+21,"h":-12.25,"i":123456789012345678901234567890}}`,
		`{"extra":{"big":1e400}}`, `{"extra":{"x":.5}}`, `{"extra":{"x":1.}}`, `{"extra":{"x":1e}}`, `{"extra":{"x":+1}}`,
		`{"extra":{"x":NaN}}`, `{"extra":{"\u0041":1,"é":"\/"}}`, `{"extra":{"a":1,}}`, `{"extra":{"a":[1,]}}`,
		`{"extra":{"a" :1}}`, `{"extra":{"a":tru}}`, `{"extra":{1:2}}`,
		`{"extra":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `}`,
		`{"extra":{"a":` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `}}`,
		`{"prev":"` + Genesis64 + `","hash":"` + Genesis64 + `"}`,
	}
	for _, s := range odd {
		checkParse(t, []byte(s))
	}
}

// Genesis64 is 64 zeros (package audit's Genesis).
var Genesis64 = strings.Repeat("0", 64)

// TestParseRecordKinds: the lines of the data path's records (a gateway request, a DNS
// answer, a flow with its process) take the fast path and decode to what was written.
func TestParseRecordKinds(t *testing.T) {
	now := time.Date(2026, 3, 4, 4, 6, 7, 123456000, time.UTC)
	recs := []Record{
		{Time: now, Seq: 9, SandboxID: "sb1", Source: SourceGateway, Proto: "http", Src: "127.0.0.1:5555",
			DstHost: "8080-sb1.airlock.localhost:8081", DstIP: "172.17.0.2", DstPort: 8080, Action: "allow",
			Rule: "access:public", Reason: "public port", Extra: map[string]any{"route": "host", "status": 200,
				"bytes": int64(3), "duration_ms": 0.412, "request_id": "r-1", "method": "GET", "result": "proxied"}},
		{Time: now, Seq: 10, SandboxID: "sb1", Source: SourceDNS, Proto: "udp", DstHost: "pypi.org", QType: "A",
			Action: "allow", Mode: "enforce", PolicyVersion: 3,
			Extra: map[string]any{"answers": []string{"151.101.0.223"}, "rcode": "NOERROR", "ttl_s": 300}},
		{Time: now, Seq: 11, Source: SourceBPF, Action: "deny", WouldDeny: true, DstPort: 443,
			Extra: map[string]any{"process": map[string]any{"pid": 12, "name": "curl", "cmdline": "curl \"https://x\"\n"},
				"refused": true, "none": nil}},
	}
	for i, r := range recs {
		r.Prev, r.Hash = Genesis64, fmt.Sprintf("%064x", i)
		line := logLine(t, r)
		if !checkParse(t, line) {
			t.Errorf("%s record fell back to encoding/json: %s", r.Source, line)
		}
	}
}

// FuzzParse: any input decodes as json.Unmarshal decodes it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"time":"2026-03-04T04:06:07.123456Z","seq":9,"source":"dns","action":"allow","extra":{"a":[1,"b",null,{"c":true}]},"prev":"x","hash":"y"}`))
	f.Add([]byte(`{"reason":"a\"b\u00e9\ud83d\ude00","extra":{"n":-1.5e-7}}`))
	f.Fuzz(func(t *testing.T, line []byte) { checkParse(t, line) })
}

// BenchmarkParse compares Parse with json.Unmarshal on a gateway record's line.
func BenchmarkParse(b *testing.B) {
	r := Record{Time: time.Now(), Seq: 9, SandboxID: "sb1", Source: SourceGateway, Proto: "http", Src: "127.0.0.1:5555",
		DstHost: "8080-sb1.airlock.localhost:8081", DstIP: "172.17.0.2", DstPort: 8080, Action: "allow",
		Rule: "access:public", Reason: "public port", Prev: Genesis64, Hash: Genesis64,
		Extra: map[string]any{"route": "host", "status": 200, "bytes": int64(3), "duration_ms": 0.412,
			"request_id": "r-1", "method": "GET", "result": "proxied"}}
	line := logLine(b, r)
	b.Run("Parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r Record
			if err := Parse(line, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestAppendFloat64MatchesJSON: AppendFloat64 writes every finite float64 as
// json.Marshal does (audit/ocsf relies on it for the numbers of records read back).
func TestAppendFloat64MatchesJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for range 100_000 {
		f := randFloat(rng)
		want, err := json.Marshal(f)
		if err != nil {
			continue // NaN, ±Inf: callers hand those to encoding/json
		}
		if got := AppendFloat64([]byte("x"), f); string(got) != "x"+string(want) {
			t.Fatalf("AppendFloat64(%v) = %s, want %s", f, got[1:], want)
		}
	}
}
