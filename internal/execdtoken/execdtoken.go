// Package execdtoken derives each sandbox's execd credential (docs/architecture.md,
// "Control surfaces are never public"). Every sandbox's execd requires its own token in
// opensandbox.HeaderExecdAccessToken (X-EXECD-ACCESS-TOKEN, execd-api.yaml
// securitySchemes AccessToken); the token is
//
//	base64url(HMAC-SHA256(key, "airlock-execd-token\x00" + sandbox id))   (43 characters)
//
// with one platform key, so lifecycle (which delivers it into the sandbox, sends it on
// its server proxy and release calls, and lists it in the endpoint of port 44772) and
// the gateway (which sends it upstream and accepts it from clients) compute it without a
// per-sandbox secret travelling in the watch stream or sitting in the store. A key
// change invalidates every running sandbox's token: keep it with the state.
package execdtoken

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of a generated key in bytes; ParseKey accepts 16 bytes or more.
const KeySize = 32

// domain separates this HMAC use from any other use of the same key.
const domain = "airlock-execd-token\x00"

// Key is the platform's execd key. The zero value derives nothing (Derive returns "").
type Key []byte

// NewKey returns a random key of KeySize bytes.
func NewKey() Key {
	k := make(Key, KeySize)
	if _, err := rand.Read(k); err != nil {
		panic("execdtoken: crypto/rand: " + err.Error())
	}
	return k
}

// ParseKey reads a key written as "base64:<standard base64>" or "hex:<hex digits>"
// (surrounding space ignored), at least 16 bytes.
func ParseKey(s string) (Key, error) {
	s = strings.TrimSpace(s)
	var b []byte
	var err error
	switch {
	case strings.HasPrefix(s, "base64:"):
		b, err = base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "base64:"))
	case strings.HasPrefix(s, "hex:"):
		b, err = hex.DecodeString(strings.TrimPrefix(s, "hex:"))
	default:
		return nil, errors.New(`execd key: want "base64:…" or "hex:…"`)
	}
	if err != nil {
		return nil, fmt.Errorf("execd key: %w", err)
	}
	if len(b) < 16 {
		return nil, fmt.Errorf("execd key: %d bytes, want at least 16", len(b))
	}
	return Key(b), nil
}

// String writes k in ParseKey's base64 form.
func (k Key) String() string { return "base64:" + base64.StdEncoding.EncodeToString(k) }

// FromAPIKey derives a key from the lifecycle API key, for deployments that configure
// no execd key of their own (airlock lifecycle and airlock gateway on Kubernetes, where
// every replica and gateway holds the API key): HMAC-SHA256 of the API key under a fixed
// label. Changing the API key then changes every sandbox's token; set an execd key to
// keep them apart. Empty for an empty API key.
func FromAPIKey(apiKey string) Key {
	if apiKey == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte("airlock-execd-key-from-api-key"))
	m.Write([]byte(apiKey))
	return Key(m.Sum(nil))
}

// LoadOrCreate reads the key stored at path, or stores a new one there (mode 0600).
func LoadOrCreate(path string) (Key, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return ParseKey(string(b))
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the execd key: %w", err)
	}
	k := NewKey()
	if err := os.WriteFile(path, []byte(k.String()+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("storing the execd key: %w", err)
	}
	return k, nil
}

// Derive returns sandbox id's execd token, "" when k is empty.
func (k Key) Derive(id string) string {
	if len(k) == 0 {
		return ""
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte(domain))
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Matches reports, in constant time, whether got is sandbox id's token; always false
// for an empty k.
func (k Key) Matches(id, got string) bool {
	if len(k) == 0 {
		return false
	}
	want := k.Derive(id)
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
