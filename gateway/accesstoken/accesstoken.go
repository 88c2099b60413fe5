// Package accesstoken reads and checks the header credentials the gateway accepts on a
// sandbox port (docs/architecture.md#control-surfaces-are-never-public):
//
//   - the sandbox's access token, header X-Airlock-Access-Token or
//     OpenSandbox-Secure-Access (OpenSandbox OSEP-0011); lifecycle creates one per
//     sandbox and publishes only its SHA-256 (watch.Access.TokenSHA256, 64 hex digits);
//   - the lifecycle API key, header OPEN-SANDBOX-API-KEY, of which the gateway is given
//     only the SHA-256 as well.
//
// The gateway never holds either secret in clear. A check hashes the presented value
// with SHA-256 and compares the digests in constant time; it performs no I/O and, for
// values up to MaxStackLen bytes, allocates nothing. The header names are package
// opensandbox's (HeaderAccessToken, HeaderSecureAccess, HeaderAPIKey).
package accesstoken

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
)

// MaxStackLen is the longest presented value Sum hashes without a heap allocation
// (access tokens are 64 characters, generated API keys 35); longer values are hashed
// all the same.
const MaxStackLen = 512

// ErrMalformed: a digest is not 64 hexadecimal digits.
var ErrMalformed = errors.New("accesstoken: a SHA-256 digest must be 64 hexadecimal digits")

// Digest is the SHA-256 of a credential. The zero Digest stands for "none" and matches
// nothing.
type Digest [sha256.Size]byte

// Sum returns the SHA-256 of secret. It allocates only for values longer than
// MaxStackLen.
func Sum(secret string) Digest {
	if len(secret) <= MaxStackLen {
		var buf [MaxStackLen]byte
		n := copy(buf[:], secret)
		return sha256.Sum256(buf[:n])
	}
	return sha256.Sum256([]byte(secret))
}

// ParseDigest decodes 64 hexadecimal digits (either case), the form of
// watch.Access.TokenSHA256 and of the gateway's api_key_sha256. Anything else,
// including the all-zero digest, is ErrMalformed.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*len(d) {
		return Digest{}, ErrMalformed
	}
	for i := range d {
		hi, ok1 := unhex(s[2*i])
		lo, ok2 := unhex(s[2*i+1])
		if !ok1 || !ok2 {
			return Digest{}, ErrMalformed
		}
		d[i] = hi<<4 | lo
	}
	if d.IsZero() {
		return Digest{}, ErrMalformed
	}
	return d, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// String returns the digest as 64 lowercase hexadecimal digits.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// IsZero reports whether d is the zero Digest ("none").
func (d Digest) IsZero() bool { return d == Digest{} }

// Matches reports whether SHA-256(secret) equals d, comparing in constant time. A nil or
// zero d matches nothing. It allocates nothing for secrets up to MaxStackLen bytes.
func (d *Digest) Matches(secret string) bool {
	if d == nil || d.IsZero() {
		return false
	}
	got := Sum(secret)
	return subtle.ConstantTimeCompare(got[:], d[:]) == 1
}

// Token returns the access token h carries and whether either token header is present
// (an empty value counts as present: it is a wrong token, not a missing one).
// X-Airlock-Access-Token wins when both are sent; of repeated values the first counts.
func Token(h http.Header) (string, bool) {
	if v, ok := h[opensandbox.HeaderAccessToken]; ok {
		return first(v), true
	}
	if v, ok := h[opensandbox.HeaderSecureAccess]; ok {
		return first(v), true
	}
	return "", false
}

// APIKey returns the OPEN-SANDBOX-API-KEY value h carries and whether it is present.
func APIKey(h http.Header) (string, bool) {
	v, ok := h[opensandbox.HeaderAPIKey]
	return first(v), ok
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
