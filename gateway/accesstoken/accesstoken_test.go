package accesstoken

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/opensandbox"
)

func TestSumMatchesStdlib(t *testing.T) {
	for _, s := range []string{"", "tok-123", strings.Repeat("x", MaxStackLen), strings.Repeat("y", MaxStackLen+1)} {
		want := sha256.Sum256([]byte(s))
		if got := Sum(s); got != Digest(want) {
			t.Errorf("Sum(%d bytes) = %x, want %x", len(s), got, want)
		}
	}
}

func TestParseDigest(t *testing.T) {
	sum := sha256.Sum256([]byte("tok"))
	lower := hex.EncodeToString(sum[:])
	for _, s := range []string{lower, strings.ToUpper(lower)} {
		d, err := ParseDigest(s)
		if err != nil || d != Digest(sum) || d.String() != lower {
			t.Errorf("ParseDigest(%q) = %v %v", s, d, err)
		}
	}
	for name, s := range map[string]string{
		"empty": "", "short": lower[:62], "long": lower + "00", "not_hex": "g" + lower[1:],
		"space": " " + lower[1:], "zero": strings.Repeat("0", 64),
	} {
		if _, err := ParseDigest(s); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

func TestMatches(t *testing.T) {
	d := Sum("right")
	cases := []struct {
		name string
		d    *Digest
		in   string
		want bool
	}{
		{"right", &d, "right", true},
		{"wrong", &d, "wrong", false},
		{"prefix", &d, "righ", false},
		{"empty", &d, "", false},
		{"nil_digest", nil, "right", false},
		{"zero_digest", &Digest{}, "", false},
	}
	for _, c := range cases {
		if got := c.d.Matches(c.in); got != c.want {
			t.Errorf("%s: Matches = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	cases := []struct {
		name    string
		h       http.Header
		tok     string
		present bool
	}{
		{"none", http.Header{}, "", false},
		{"airlock", http.Header{opensandbox.HeaderAccessToken: {"a"}}, "a", true},
		{"opensandbox", http.Header{opensandbox.HeaderSecureAccess: {"b"}}, "b", true},
		{"airlock_wins", http.Header{opensandbox.HeaderSecureAccess: {"b"}, opensandbox.HeaderAccessToken: {"a"}}, "a", true},
		{"empty_value_is_present", http.Header{opensandbox.HeaderAccessToken: {""}}, "", true},
		{"no_values_is_present", http.Header{opensandbox.HeaderAccessToken: nil}, "", true},
		{"first_of_repeated", http.Header{opensandbox.HeaderAccessToken: {"a", "b"}}, "a", true},
	}
	for _, c := range cases {
		if tok, ok := Token(c.h); tok != c.tok || ok != c.present {
			t.Errorf("%s: Token = %q %v, want %q %v", c.name, tok, ok, c.tok, c.present)
		}
	}
	// What clients send is canonicalised by net/http into the names this package reads.
	h := http.Header{}
	h.Set("OPEN-SANDBOX-API-KEY", "k")
	h.Set("OpenSandbox-Secure-Access", "t")
	if k, ok := APIKey(h); k != "k" || !ok {
		t.Errorf("APIKey = %q %v", k, ok)
	}
	if tok, ok := Token(h); tok != "t" || !ok {
		t.Errorf("Token = %q %v", tok, ok)
	}
	if _, ok := APIKey(http.Header{}); ok {
		t.Error("APIKey present in an empty header")
	}
}

func TestNoAllocations(t *testing.T) {
	d := Sum(strings.Repeat("t", 64))
	h := http.Header{opensandbox.HeaderSecureAccess: {strings.Repeat("t", 64)}}
	n := testing.AllocsPerRun(100, func() {
		tok, _ := Token(h)
		if !d.Matches(tok) {
			t.Fatal("no match")
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per check, want 0", n)
	}
}

// FuzzParseDigest: ParseDigest never panics, accepts exactly 64 hex digits (not all zero),
// and what it accepts prints back as the lowercase input.
func FuzzParseDigest(f *testing.F) {
	sum := sha256.Sum256([]byte("tok"))
	f.Add(hex.EncodeToString(sum[:]))
	f.Add(strings.ToUpper(hex.EncodeToString(sum[:])))
	f.Add(strings.Repeat("0", 64))
	f.Add("")
	f.Add("zz" + hex.EncodeToString(sum[1:]))
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDigest(s)
		std, stdErr := hex.DecodeString(s)
		wantOK := stdErr == nil && len(std) == sha256.Size && Digest(std) != Digest{}
		if (err == nil) != wantOK {
			t.Fatalf("ParseDigest(%q) err %v, hex.DecodeString says ok=%v", s, err, wantOK)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) || !d.IsZero() {
				t.Fatalf("ParseDigest(%q): %v %v", s, d, err)
			}
			return
		}
		if d.String() != strings.ToLower(s) {
			t.Fatalf("ParseDigest(%q).String() = %q", s, d.String())
		}
	})
}

// FuzzMatches: a digest matches exactly the secret it was made from, whatever the bytes,
// and the answer agrees with a plain SHA-256 comparison.
func FuzzMatches(f *testing.F) {
	f.Add("tok-123", "tok-123")
	f.Add("tok-123", "tok-124")
	f.Add("", "")
	f.Add(strings.Repeat("a", 64), strings.Repeat("a", 63))
	f.Add(strings.Repeat("k", MaxStackLen+3), strings.Repeat("k", MaxStackLen+3))
	f.Add("\x00\xff", "\x00\xff\x00")
	f.Fuzz(func(t *testing.T, secret, presented string) {
		d := Sum(secret)
		if !d.Matches(secret) {
			t.Fatalf("digest of %q does not match it", secret)
		}
		want := sha256.Sum256([]byte(presented)) == sha256.Sum256([]byte(secret))
		if got := d.Matches(presented); got != want {
			t.Fatalf("Matches(%q) for secret %q = %v, want %v", presented, secret, got, want)
		}
		if parsed, err := ParseDigest(d.String()); err != nil || parsed != d {
			t.Fatalf("digest does not round-trip through its hex form: %v", err)
		}
	})
}
