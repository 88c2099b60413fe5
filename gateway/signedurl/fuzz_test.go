package signedurl

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// FuzzVerify feeds arbitrary route parts to Verify: it never panics, every error is one
// of the package's sentinels, and a route that verifies carries exactly the tag Mint
// would give it with the key its tag names.
func FuzzVerify(f *testing.F) {
	kr := fuzzKeyring(f, "a", "a", "b")
	good, _ := kr.Mint("box-1", 44772, time.Unix(4102444800, 0))
	f.Add(good.ID, good.Port, good.ExpiresB36, good.Tag)
	f.Add("box-1", 18080, good.ExpiresB36, good.Tag)
	f.Add("box-1", 44772, "0", good.Tag)
	f.Add("", 0, "", "")
	f.Add("x", -1, "zzzzzzzzzzzzzz", "0123456789abcz")
	f.Add("x", 80, "01", "vvvvvvvvvvvvvb")
	f.Fuzz(func(t *testing.T, id string, port int, exp, tag string) {
		err := kr.Verify(id, port, exp, tag, time.Unix(1e9, 0))
		if err == nil {
			if !ValidTag(tag) || !ValidExpiry(exp) {
				t.Fatalf("Verify accepted malformed parts %q %q", exp, tag)
			}
			if want := kr.tag(tag[MACLen], id, port, exp, 0); want != tag {
				t.Fatalf("Verify accepted tag %q, Mint's is %q", tag, want)
			}
			return
		}
		for _, s := range []error{ErrMalformed, ErrUnknownKey, ErrBadSignature, ErrExpired} {
			if errors.Is(err, s) {
				return
			}
		}
		t.Fatalf("Verify error %v is none of the sentinels", err)
	})
}

// FuzzMintVerify mints routes for arbitrary ids, ports and expiries: each verifies with
// the minting keyring before its expiry and is ErrExpired after it; a keyring with the
// same key id but another secret, another port or id, and any changed tag character are
// refused.
func FuzzMintVerify(f *testing.F) {
	right := fuzzKeyring(f, "a", "a")
	other, err := NewKeyring("a", Key{ID: "a", Secret: []byte("not-the-same-secret-at-all")})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("box-1", 44772, int64(4102444800), uint8(0))
	f.Add("a", 1, int64(1), uint8(13))
	f.Add("My.Box_2", 65535, int64(1<<40), uint8(7))
	f.Fuzz(func(t *testing.T, id string, port int, sec int64, flip uint8) {
		if sec >= 1<<62 {
			return // Verify reads expiries beyond 2^62 s as 2^62 s (year 146 billion)
		}
		r, err := right.Mint(id, port, time.Unix(sec, 0))
		if err != nil {
			if !errors.Is(err, ErrInvalidRoute) {
				t.Fatalf("Mint error %v is not ErrInvalidRoute", err)
			}
			return
		}
		before, after := r.Expires.Add(-time.Second), r.Expires.Add(time.Second)
		if err := right.Verify(id, port, r.ExpiresB36, r.Tag, before); err != nil {
			t.Fatalf("minted route does not verify: %v", err)
		}
		if err := right.Verify(id, port, r.ExpiresB36, r.Tag, after); !errors.Is(err, ErrExpired) {
			t.Fatalf("after expiry: %v, want ErrExpired", err)
		}
		if err := other.Verify(id, port, r.ExpiresB36, r.Tag, before); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("verified with another secret: %v", err)
		}
		if err := right.Verify(id, port%65535+1, r.ExpiresB36, r.Tag, before); err == nil {
			t.Fatal("verified for another port")
		}
		if err := right.Verify(id+"x", port, r.ExpiresB36, r.Tag, before); err == nil {
			t.Fatal("verified for another id")
		}
		i := int(flip) % MACLen
		b := []byte(r.Tag)
		b[i] = "0123456789abcdefghijklmnopqrstuv"[(mac32Index(b[i])+1)%32]
		if err := right.Verify(id, port, r.ExpiresB36, string(b), before); err == nil {
			t.Fatalf("verified with tag character %d changed", i)
		}
	})
}

// FuzzParseExpiry: ParseExpiry never panics, accepts only ValidExpiry strings, and what it
// accepts formats back to the same string.
func FuzzParseExpiry(f *testing.F) {
	for _, s := range []string{"0", "x2qxvk", "3w5e11264sgsf", "3w5e11264sgsg", "00", "", "A", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseExpiry(s)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseExpiry(%q) error %v is not ErrMalformed", s, err)
			}
			return
		}
		if !ValidExpiry(s) || strconv.FormatUint(v, 36) != s {
			t.Fatalf("ParseExpiry(%q) = %d does not round-trip", s, v)
		}
	})
}

func fuzzKeyring(f *testing.F, active string, ids ...string) *Keyring {
	var keys []Key
	for _, id := range ids {
		keys = append(keys, Key{ID: id, Secret: []byte("secret-of-key-" + id + "-0123456789")})
	}
	kr, err := NewKeyring(active, keys...)
	if err != nil {
		f.Fatal(err)
	}
	return kr
}

func mac32Index(c byte) int {
	if c <= '9' {
		return int(c - '0')
	}
	return int(c-'a') + 10
}
