package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
)

// Key files are one line of standard base64: the 32-byte Ed25519 seed for a signing key
// (Config.SigningKey), the 32-byte public key for verifying (VerifyOptions.PublicKey).
// `airlock audit keygen` writes a pair.

// GenerateKeyFiles writes a new signing key to privPath (mode 0600) and its public key
// to pubPath.
func GenerateKeyFiles(privPath, pubPath string) error {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	if err := os.WriteFile(privPath, []byte(base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644)
}

// LoadSigningKey reads a signing key file.
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	b, err := readKey(path, ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	return ed25519.NewKeyFromSeed(b), nil
}

// LoadPublicKey reads a public key file.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	b, err := readKey(path, ed25519.PublicKeySize)
	if err != nil {
		return nil, err
	}
	return ed25519.PublicKey(b), nil
}

func readKey(path string, size int) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil || len(b) != size {
		return nil, fmt.Errorf("audit: %s is not a base64 %d-byte Ed25519 key", path, size)
	}
	return b, nil
}
