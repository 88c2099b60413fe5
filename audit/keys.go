package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Key files are one line of standard base64: the 32-byte Ed25519 seed for a signing key
// (Config.SigningKey), the 32-byte public key for verifying (VerifyOptions.PublicKey).
// `airlock audit keygen PREFIX` writes a pair, PREFIX.key and PREFIX.pub.

// DefaultKeyFiles are the signing key and public key files of the audit directory dir
// when none is configured: dir+".key" and dir+".pub", beside the directory rather than
// in it (/var/lib/airlock/audit.key for /var/lib/airlock/audit), so that the log can be
// copied or shipped without its signing key. `airlock audit verify` reads dir+".pub" by
// default.
func DefaultKeyFiles(dir string) (priv, pub string) {
	d := filepath.Clean(dir)
	return d + ".key", d + ".pub"
}

// PublicKeyFile is the public key file that goes with the signing key file priv: its
// name with ".key" replaced by ".pub" (".pub" appended to a name without ".key"), as
// `airlock audit keygen` names a pair.
func PublicKeyFile(priv string) string {
	return strings.TrimSuffix(priv, ".key") + ".pub"
}

// LoadOrCreateSigningKey returns the signing key in privPath, generating one (mode
// 0600, created exclusively) when the file does not exist, and makes sure pubPath holds
// its public key: written (0644) when missing, an error when it holds another key.
// created reports whether the key was generated. Missing parent directories are
// created (0700).
func LoadOrCreateSigningKey(privPath, pubPath string) (key ed25519.PrivateKey, created bool, err error) {
	key, err = LoadSigningKey(privPath)
	if errors.Is(err, os.ErrNotExist) {
		key, err = createSigningKey(privPath)
		created = err == nil
	}
	if err != nil {
		return nil, false, err
	}
	pub := key.Public().(ed25519.PublicKey)
	have, err := LoadPublicKey(pubPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.WriteFile(pubPath, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644); err != nil {
			return nil, false, fmt.Errorf("audit: writing the public key: %w", err)
		}
	case err != nil:
		return nil, false, err
	case !bytes.Equal(have, pub):
		return nil, false, fmt.Errorf("audit: %s is not the public key of %s", pubPath, privPath)
	}
	return key, created, nil
}

// createSigningKey writes a new signing key to path, failing when the file appeared
// in the meantime (another process generating it: the next start reads that one).
func createSigningKey(path string) (ed25519.PrivateKey, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: creating the signing key: %w", err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(priv.Seed()) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("audit: writing the signing key: %w", err)
	}
	return priv, nil
}

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
