// Package signedurl mints and verifies Airlock's signed sandbox routes: a credential that
// fits in one DNS label and grants access to one port of one sandbox until an expiry time.
//
// A signed route has four parts, joined by "-" in a host label or header value and by "/"
// in a path:
//
//	<port>-<sandbox id>-<expires_b36>-<tag>     host label (≤ 63 octets, RFC 1035 §2.3.4)
//	/<sandbox id>/<port>/<expires_b36>/<tag>/…  path form (OSEP-0011 URI mode)
//
// expires_b36 is the expiry in Unix seconds, base 36, lowercase, no leading zeros
// (strconv.FormatUint(sec, 36), as OpenSandbox OSEP-0011 normalises the `expires` query
// parameter). tag is 14 characters: 13 base32hex (RFC 4648 §7, lowercase) digits of the
// first 64 bits of HMAC-SHA256(secret, canonical), then the one-character key id
// ([0-9a-z]) that names the secret, so keys rotate by adding a new id, making it active,
// and dropping the old one once its routes have expired. The canonical string is
//
//	"airlock-route-v1\n" + key id + "\n" + sandbox id + "\n" + port + "\n" + expires_b36 + "\n"
//
// followed, when the sandbox's signed-URL epoch is not 0, by "epoch " + decimal epoch +
// "\n". The epoch is not part of the route: lifecycle keeps it with the sandbox and bumps
// it to revoke every signed URL minted before (POST /sandboxes/{id}/signed-urls/revoke),
// the gateway learns it from the watch stream and verifies against the current one. A
// route minted before epochs existed was signed with epoch 0 and keeps working until the
// first revocation.
//
// Unlike OSEP-0011's 32-bit tag, the tag is an HMAC of at least 64 bits; the route shape
// and the expiry encoding are the same.
package signedurl

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Sizes of the parts of a signed route.
const (
	// MACLen is the length of the encoded MAC: 64 bits in base32hex.
	MACLen = 13
	// TagLen is MACLen plus the key id.
	TagLen = MACLen + 1
	// MaxExpiryLen is the longest expires_b36 (the largest uint64).
	MaxExpiryLen = 13
	// MaxLabelLen is the longest DNS label (RFC 1035 §2.3.4).
	MaxLabelLen = 63
	// MinSecretLen is the shortest accepted secret, in bytes.
	MinSecretLen = 16
)

// Errors. Verify wraps them; match with errors.Is.
var (
	// ErrMalformed: a part of the route is not of its syntax (HTTP 400).
	ErrMalformed = errors.New("signedurl: malformed signed route")
	// ErrUnknownKey: the tag names a key id the keyring does not hold (HTTP 401).
	ErrUnknownKey = errors.New("signedurl: unknown signing key")
	// ErrBadSignature: the tag does not match (HTTP 401).
	ErrBadSignature = errors.New("signedurl: signature does not match")
	// ErrExpired: the route is authentic but its expiry has passed (HTTP 401).
	ErrExpired = errors.New("signedurl: signed route expired")
	// ErrTooLong: the host label would exceed 63 octets; use the path form.
	ErrTooLong = errors.New("signedurl: signed host label longer than 63 octets")
	// ErrInvalidKey: a key id or secret is not acceptable.
	ErrInvalidKey = errors.New("signedurl: invalid key")
	// ErrInvalidRoute: the sandbox id, port or expiry cannot be signed.
	ErrInvalidRoute = errors.New("signedurl: invalid route")
)

var mac32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// Key is one signing secret and its one-character id ([0-9a-z]).
type Key struct {
	ID     string
	Secret []byte
}

// ParseKey parses "<id>=<secret>" where secret is "base64:<std or url base64>",
// "hex:<hex>" or, for tests only, "raw:<text>". The secret must be at least MinSecretLen
// bytes.
func ParseKey(spec string) (Key, error) {
	id, enc, ok := strings.Cut(spec, "=")
	if !ok {
		return Key{}, fmt.Errorf("%w: want <id>=base64:<secret> or <id>=hex:<secret>", ErrInvalidKey)
	}
	secret, err := DecodeSecret(enc)
	if err != nil {
		return Key{}, err
	}
	k := Key{ID: id, Secret: secret}
	return k, k.validate()
}

// DecodeSecret decodes "base64:…", "hex:…" or "raw:…".
func DecodeSecret(enc string) ([]byte, error) {
	kind, val, _ := strings.Cut(enc, ":")
	var (
		b   []byte
		err error
	)
	switch kind {
	case "base64":
		b, err = base64.StdEncoding.DecodeString(val)
		if err != nil {
			b, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(val, "="))
		}
	case "hex":
		b, err = hex.DecodeString(val)
	case "raw":
		b = []byte(val)
	default:
		return nil, fmt.Errorf("%w: secret must start with base64:, hex: or raw:", ErrInvalidKey)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s secret does not decode: %v", ErrInvalidKey, kind, err)
	}
	return b, nil
}

func (k Key) validate() error {
	if len(k.ID) != 1 || keyIndex(k.ID[0]) < 0 {
		return fmt.Errorf("%w: key id %q must be one character of [0-9a-z]", ErrInvalidKey, k.ID)
	}
	if len(k.Secret) < MinSecretLen {
		return fmt.Errorf("%w: key %q secret has %d bytes, want at least %d", ErrInvalidKey, k.ID, len(k.Secret), MinSecretLen)
	}
	return nil
}

func keyIndex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 10
	}
	return -1
}

// Keyring holds the secrets that verify routes and names the one that mints them. It is
// immutable and safe for concurrent use; rotate by building a new Keyring.
type Keyring struct {
	active  byte
	secrets [36][]byte
}

// NewKeyring returns a keyring that verifies with every key and mints with the key whose
// id is active. Duplicate ids are an error.
func NewKeyring(active string, keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalidKey)
	}
	kr := &Keyring{}
	for _, k := range keys {
		if err := k.validate(); err != nil {
			return nil, err
		}
		i := keyIndex(k.ID[0])
		if kr.secrets[i] != nil {
			return nil, fmt.Errorf("%w: key id %q given twice", ErrInvalidKey, k.ID)
		}
		kr.secrets[i] = append([]byte(nil), k.Secret...)
	}
	if len(active) != 1 || keyIndex(active[0]) < 0 || kr.secrets[keyIndex(active[0])] == nil {
		return nil, fmt.Errorf("%w: active key %q is not among the keys", ErrInvalidKey, active)
	}
	kr.active = active[0]
	return kr, nil
}

// Active returns the id of the minting key.
func (kr *Keyring) Active() string { return string(kr.active) }

// Route is one minted signed route.
type Route struct {
	ID         string
	Port       int
	Expires    time.Time
	ExpiresB36 string
	Tag        string
	// Epoch is the sandbox's signed-URL epoch the tag covers (not part of the route).
	Epoch uint64
}

// Label returns the host label form "<port>-<id>-<expires_b36>-<tag>", or ErrTooLong.
func (r Route) Label() (string, error) {
	if !HostSafeID(r.ID) {
		return "", fmt.Errorf("%w: sandbox id %q is not lowercase [a-z0-9-], cannot be a host label", ErrInvalidRoute, r.ID)
	}
	l := strconv.Itoa(r.Port) + "-" + r.ID + "-" + r.ExpiresB36 + "-" + r.Tag
	if len(l) > MaxLabelLen {
		return "", fmt.Errorf("%w: %d octets for sandbox id %q", ErrTooLong, len(l), r.ID)
	}
	return l, nil
}

// Path returns the path form "/<id>/<port>/<expires_b36>/<tag>" (no trailing slash).
func (r Route) Path() string {
	return "/" + r.ID + "/" + strconv.Itoa(r.Port) + "/" + r.ExpiresB36 + "/" + r.Tag
}

// Mint signs a route to port of sandbox id valid until expires (whole seconds; sub-second
// parts are dropped). id must be 1..128 characters of [A-Za-z0-9._-] (host labels need
// lowercase [a-z0-9-]); port 1..65535; expires after the Unix epoch. The caller decides
// whether an expiry in the past is acceptable.
func (kr *Keyring) Mint(id string, port int, expires time.Time) (Route, error) {
	return kr.MintEpoch(id, port, expires, 0)
}

// MintEpoch is Mint for a sandbox whose signed-URL epoch is epoch: the route verifies
// only while the sandbox's epoch stays the same (VerifyEpoch).
func (kr *Keyring) MintEpoch(id string, port int, expires time.Time, epoch uint64) (Route, error) {
	if !ValidID(id) {
		return Route{}, fmt.Errorf("%w: sandbox id %q", ErrInvalidRoute, id)
	}
	if port < 1 || port > 65535 {
		return Route{}, fmt.Errorf("%w: port %d out of 1..65535", ErrInvalidRoute, port)
	}
	sec := expires.Unix()
	if sec <= 0 {
		return Route{}, fmt.Errorf("%w: expiry %s before the Unix epoch", ErrInvalidRoute, expires)
	}
	exp := strconv.FormatUint(uint64(sec), 36)
	return Route{
		ID: id, Port: port, Expires: time.Unix(sec, 0).UTC(), ExpiresB36: exp,
		Tag: kr.tag(kr.active, id, port, exp, epoch), Epoch: epoch,
	}, nil
}

// tag computes the 14-character tag with key id kid.
func (kr *Keyring) tag(kid byte, id string, port int, exp string, epoch uint64) string {
	m := hmac.New(sha256.New, kr.secrets[keyIndex(kid)])
	m.Write([]byte(canonical(kid, id, port, exp, epoch)))
	sum := m.Sum(nil)
	var out [TagLen]byte
	mac32.Encode(out[:MACLen], sum[:8])
	out[MACLen] = kid
	return string(out[:])
}

func canonical(kid byte, id string, port int, exp string, epoch uint64) string {
	s := "airlock-route-v1\n" + string(kid) + "\n" + id + "\n" + strconv.Itoa(port) + "\n" + exp + "\n"
	if epoch != 0 {
		s += "epoch " + strconv.FormatUint(epoch, 10) + "\n"
	}
	return s
}

// Verify checks a signed route for port of sandbox id at time now: syntax (ErrMalformed),
// key id (ErrUnknownKey), tag by constant-time comparison (ErrBadSignature), then expiry
// (ErrExpired when now is after the expiry second).
func (kr *Keyring) Verify(id string, port int, expB36, tag string, now time.Time) error {
	return kr.VerifyEpoch(id, port, expB36, tag, 0, now)
}

// VerifyEpoch is Verify for a sandbox whose current signed-URL epoch is epoch: a route
// minted under another epoch is ErrBadSignature.
func (kr *Keyring) VerifyEpoch(id string, port int, expB36, tag string, epoch uint64, now time.Time) error {
	sec, err := ParseExpiry(expB36)
	if err != nil {
		return err
	}
	if !ValidTag(tag) {
		return fmt.Errorf("%w: tag %q", ErrMalformed, tag)
	}
	kid := tag[MACLen]
	if kr == nil || kr.secrets[keyIndex(kid)] == nil {
		return fmt.Errorf("%w: %q", ErrUnknownKey, string(kid))
	}
	want := kr.tag(kid, id, port, expB36, epoch)
	if subtle.ConstantTimeCompare([]byte(want), []byte(tag)) != 1 {
		return ErrBadSignature
	}
	if now.Unix() > int64(min(sec, 1<<62)) {
		return fmt.Errorf("%w at %s", ErrExpired, time.Unix(int64(min(sec, 1<<62)), 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// ParseExpiry decodes expires_b36: 1..13 characters of [0-9a-z], no leading zero (except
// "0" itself), fitting a uint64. Anything else is ErrMalformed.
func ParseExpiry(s string) (uint64, error) {
	if !ValidExpiry(s) {
		return 0, fmt.Errorf("%w: expiry %q", ErrMalformed, s)
	}
	v, err := strconv.ParseUint(s, 36, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: expiry %q: %v", ErrMalformed, s, err)
	}
	return v, nil
}

// ValidExpiry reports whether s has the syntax of expires_b36 (range not checked).
func ValidExpiry(s string) bool {
	if len(s) == 0 || len(s) > MaxExpiryLen || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if keyIndex(s[i]) < 0 {
			return false
		}
	}
	return true
}

// ValidTag reports whether s has the syntax of a tag: 13 of [0-9a-v] then one of [0-9a-z].
// The last MAC character carries 4 bits, so only every other letter is canonical there;
// Verify compares whole strings, so a non-canonical tag simply fails to match.
func ValidTag(s string) bool {
	if len(s) != TagLen {
		return false
	}
	for i := 0; i < MACLen; i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'v') {
			return false
		}
	}
	return keyIndex(s[MACLen]) >= 0
}

// ValidID reports whether id can name a sandbox in a route: 1..128 characters of
// [A-Za-z0-9._-].
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// HostSafeID reports whether id can appear in a host label: lowercase [a-z0-9-] only.
func HostSafeID(id string) bool {
	if len(id) == 0 || len(id) > MaxLabelLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
