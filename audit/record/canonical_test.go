package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// referenceCanonical is the canonical form by definition: what the writer wrote before
// AppendCanonical, json.Marshal of canonicalRecord.
func referenceCanonical(r Record) ([]byte, error) {
	return json.Marshal(canonicalRecord{
		Time: r.Time.UTC().Format(TimeFormat), Seq: r.Seq, SandboxID: r.SandboxID, Source: r.Source,
		Proto: r.Proto, Src: r.Src, DstHost: r.DstHost, DstIP: r.DstIP, DstPort: r.DstPort, QType: r.QType,
		Action: r.Action, Mode: r.Mode, WouldDeny: r.WouldDeny, Rule: r.Rule, Reason: r.Reason,
		PolicyVersion: r.PolicyVersion, Extra: r.Extra,
	})
}

// Fallback types: encoding/json encodes these through reflection, methods or not at all.
type (
	namedString string
	textKey     struct{ A, B int }
	marshaler   struct{ s string }
	failing     struct{}
	point       struct {
		X    int     `json:"x"`
		Y    float64 `json:"y,omitempty"`
		Name string
	}
)

func (m marshaler) MarshalJSON() ([]byte, error) { return []byte(` { "m" : ` + m.s + ` } `), nil }
func (failing) MarshalJSON() ([]byte, error)     { return nil, errors.New("no <json> & such") }

// stringPieces are the fragments random strings are made of: plain ASCII, every escape
// class of encoding/json, multi-byte runes, U+2028/9, invalid UTF-8.
var stringPieces = func() []string {
	p := []string{"a", "Z", "0", " ", "example.com", "10.88.0.5:53", `"`, `\`, "/", "<", ">", "&", "'",
		"\u007f", "é", "中", "😀", "\ufffd", "\u2028", "\u2029", "\u2027", "\u202a", "\xff", "\xfe", "\xc0",
		"\x80", "\xe2\x80", "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* > U+10FFFF */, "\xc3"}
	for c := range 0x20 {
		p = append(p, string(rune(c)))
	}
	return p
}()

func randString(rng *rand.Rand) string {
	if rng.IntN(4) == 0 {
		return ""
	}
	var b strings.Builder
	for range rng.IntN(12) {
		if rng.IntN(8) == 0 { // a random byte, often invalid UTF-8
			b.WriteByte(byte(rng.IntN(256)))
			continue
		}
		b.WriteString(stringPieces[rng.IntN(len(stringPieces))])
	}
	return b.String()
}

func randFloat(rng *rand.Rand) float64 {
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return math.Copysign(0, -1)
	case 2:
		return float64(rng.IntN(100000)) / 1000 // like duration_ms
	case 3:
		return (rng.Float64() - 0.5) * math.Pow(10, float64(rng.IntN(60)-30)) // around the 'e' cutoffs
	case 4:
		return []float64{1e-6, 9.99999e-7, 1e21, 9.99999e20, 1e-7, 1e-10, 1e100, math.MaxFloat64, math.SmallestNonzeroFloat64}[rng.IntN(9)]
	default:
		return math.Float64frombits(rng.Uint64()) // may be NaN or Inf: an error either way
	}
}

// randValue returns an Extra value: mostly fast-path types, sometimes fallback ones and
// sometimes (when bad) values encoding/json cannot encode.
func randValue(rng *rand.Rand, bad bool) any {
	switch rng.IntN(26) {
	case 0:
		return nil
	case 1, 2:
		return randString(rng)
	case 3:
		return rng.IntN(2) == 0
	case 4:
		return rng.IntN(1<<20) - 1<<19
	case 5:
		return int64(rng.Uint64())
	case 6:
		return rng.Uint64() >> rng.IntN(64)
	case 7:
		return uint32(rng.Uint32())
	case 8:
		return []any{int8(rng.Int()), int16(rng.Int()), int32(rng.Int()), uint(rng.Uint64()), uint8(rng.Int()), uint16(rng.Int())}[rng.IntN(6)]
	case 9:
		f := randFloat(rng)
		if !bad && (math.IsNaN(f) || math.IsInf(f, 0)) {
			f = 1.5
		}
		return f
	case 10:
		f := float32(randFloat(rng))
		if !bad && (math.IsNaN(float64(f)) || math.IsInf(float64(f), 0)) {
			f = 2.5
		}
		return f
	case 11, 12:
		if rng.IntN(4) == 0 {
			return []string(nil)
		}
		s := make([]string, rng.IntN(4))
		for i := range s {
			s[i] = randString(rng)
		}
		return s
	case 13: // a record read back from a log: float64, []any, map[string]any
		return map[string]any{randString(rng): randValue(rng, false), "n": float64(rng.IntN(1000))}
	case 14:
		return []any{randString(rng), rng.IntN(10), nil, []string{randString(rng)}}
	case 15:
		return namedString(randString(rng))
	case 16:
		return json.Number("12.50")
	case 17:
		return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(time.FixedZone("x", 3600))
	case 18:
		return []byte(randString(rng))
	case 19:
		return point{X: rng.IntN(9), Y: float64(rng.IntN(4)) / 4, Name: randString(rng)}
	case 20:
		return &point{X: 1}
	case 21:
		return (*point)(nil)
	case 22:
		return marshaler{s: []string{`"<a&b>"`, `[1, 2]`, `"\u2028"`}[rng.IntN(3)]}
	case 23:
		if !bad {
			return map[string]int{"k": rng.IntN(3)}
		}
		return map[textKey]int{{1, 2}: 3} // a key type encoding/json refuses
	case 24:
		return [2]string{randString(rng), randString(rng)}
	default:
		if !bad {
			return randString(rng)
		}
		return []any{make(chan int), func() {}, failing{}, math.Inf(1), float32(math.NaN())}[rng.IntN(5)]
	}
}

func randRecord(rng *rand.Rand, bad bool) Record {
	var t time.Time
	switch rng.IntN(6) {
	case 0: // zero time
	case 1:
		t = time.Date(rng.IntN(20000)-5000, time.Month(rng.IntN(12)+1), rng.IntN(28)+1, 0, 0, 0, 0, time.UTC) // years < 0 and > 9999
	default:
		t = time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(time.FixedZone("z", (rng.IntN(48)-24)*1800))
	}
	n := func(v uint64) uint64 { // zero half of the time
		if rng.IntN(2) == 0 {
			return 0
		}
		return v
	}
	r := Record{Time: t, Seq: n(rng.Uint64() >> rng.IntN(64)), SandboxID: randString(rng),
		Source: Source(randString(rng)), Proto: randString(rng), Src: randString(rng),
		DstHost: randString(rng), DstIP: randString(rng), DstPort: int(int64(n(rng.Uint64())) >> rng.IntN(64)),
		QType: randString(rng), Action: randString(rng), Mode: randString(rng), WouldDeny: rng.IntN(2) == 0,
		Rule: randString(rng), Reason: randString(rng), PolicyVersion: n(rng.Uint64() >> rng.IntN(64)),
		Prev: randString(rng), Hash: randString(rng)}
	switch rng.IntN(5) {
	case 0: // no Extra
	case 1:
		r.Extra = map[string]any{}
	default:
		r.Extra = map[string]any{}
		for range rng.IntN(20) { // over 16 keys: the sort outgrows its stack array
			r.Extra[randString(rng)] = randValue(rng, bad && rng.IntN(3) == 0)
		}
	}
	return r
}

// TestCanonicalMatchesJSON: for random records (tricky strings, every omitempty case,
// every Extra value type AppendCanonical handles itself and many it hands to
// encoding/json), AppendCanonical's bytes and errors are json.Marshal's, Canonical
// returns the same bytes and MarshalJSON adds prev and hash.
func TestCanonicalMatchesJSON(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var ok, failed int
	for i := range 50_000 {
		r := randRecord(rng, i%4 == 0)
		want, werr := referenceCanonical(r)
		prefix := []byte("prefix")
		got, err := AppendCanonical(prefix, &r)
		if (err != nil) != (werr != nil) || err != nil && err.Error() != werr.Error() {
			t.Fatalf("record %+v:\nerror %v\nwant  %v", r, err, werr)
		}
		if !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("AppendCanonical changed the bytes before its own: %q", got)
		}
		if werr != nil {
			failed++
			if len(got) != len(prefix) {
				t.Fatalf("AppendCanonical failed but left %q", got[len(prefix):])
			}
			if _, err := r.MarshalJSON(); err == nil || err.Error() != werr.Error() {
				t.Fatalf("MarshalJSON error %v, want %v", err, werr)
			}
			continue
		}
		ok++
		if got := got[len(prefix):]; !bytes.Equal(got, want) {
			t.Fatalf("record %+v:\ngot  %s\nwant %s", r, got, want)
		}
		if c, err := r.Canonical(); err != nil || !bytes.Equal(c, want) {
			t.Fatalf("Canonical = %s, %v\nwant %s", c, err, want)
		}
		// prev and hash are 64 hex digits in a log: MarshalJSON writes them as they are.
		wantJSON := string(want[:len(want)-1]) + `,"prev":"` + r.Prev + `","hash":"` + r.Hash + `"}`
		if j, err := r.MarshalJSON(); err != nil || string(j) != wantJSON {
			t.Fatalf("MarshalJSON = %s, %v\nwant %s", j, err, wantJSON)
		}
	}
	t.Logf("%d records equal, %d errors equal", ok, failed)
	if ok < 30_000 || failed < 500 {
		t.Errorf("%d encodable and %d failing records: the generator lost a case", ok, failed)
	}
}

// TestCanonicalErrorCases: values encoding/json cannot encode make AppendCanonical fail
// with encoding/json's error, including a cycle through a map and a slice (whose
// message depends on the depth at which encoding/json notices it).
func TestCanonicalErrorCases(t *testing.T) {
	cyclic := map[string]any{}
	cyclic["s"] = []any{cyclic}
	for name, v := range map[string]any{
		"nan": math.NaN(), "inf": math.Inf(-1), "float32_inf": float32(math.Inf(1)), "chan": make(chan int),
		"func": func() {}, "marshaler_error": failing{}, "bad_key": map[textKey]int{{}: 1}, "cycle": cyclic,
		"nested": []any{"x", map[string]any{"y": math.NaN()}},
	} {
		t.Run(name, func(t *testing.T) {
			r := Record{Action: "allow", Extra: map[string]any{"a": 1, "b": v, "c": "z"}}
			_, werr := referenceCanonical(r)
			_, err := AppendCanonical(nil, &r)
			if err == nil || werr == nil || err.Error() != werr.Error() {
				t.Fatalf("error %v, want %v", err, werr)
			}
		})
	}
}

// TestCanonicalFixed pins a few encodings by hand (not by comparison with
// encoding/json), so that a change in either shows up.
func TestCanonicalFixed(t *testing.T) {
	for name, tc := range map[string]struct {
		r    Record
		want string
	}{
		"minimal": {Record{}, `{"time":"0001-01-01T00:00:00.000000Z","seq":0,"source":"","action":""}`},
		"escapes": {Record{Time: time.Unix(0, 1500).UTC(), Seq: 1, Source: SourceDNS, DstHost: "a\"b\\c<d>e&f\u2028g\x01\xffh\n",
			Action: "allow", WouldDeny: true, DstPort: -1},
			`{"time":"1970-01-01T00:00:00.000001Z","seq":1,"source":"dns","dst_host":"a\"b\\c\u003cd\u003ee\u0026f\u2028g\u0001\ufffdh\n","dst_port":-1,"action":"allow","would_deny":true}`},
		"extra": {Record{Action: "deny", Extra: map[string]any{"z": []string(nil), "a": []string{}, "m": 1.5e-7, "n": 1e21, "o": 0.25, "p": float32(0.1), "<": uint64(math.MaxUint64)}},
			`{"time":"0001-01-01T00:00:00.000000Z","seq":0,"source":"","action":"deny","extra":{"\u003c":18446744073709551615,"a":[],"m":1.5e-7,"n":1e+21,"o":0.25,"p":0.1,"z":null}}`},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := AppendCanonical(nil, &tc.r)
			if err != nil || string(got) != tc.want {
				t.Errorf("got  %s (%v)\nwant %s", got, err, tc.want)
			}
		})
	}
}

// FuzzAppendString: appendString writes what json.Marshal writes for any string.
func FuzzAppendString(f *testing.F) {
	for _, s := range stringPieces {
		f.Add(s + "x" + s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
	})
}
