package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// The checkpoints, the head and the anchors are small JSON statements, each sealed the
// same way: a hex SHA-256 digest of its JSON with the digest and signature fields empty,
// signed with Ed25519 over the digest's bytes (base64). The helpers below are that one
// way, and the one way to append such statements to a JSON Lines file and read them back.

// jsonDigest returns the hex SHA-256 of v's JSON encoding. The caller passes v with its
// own digest and signature fields empty.
func jsonDigest(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// signDigest returns the base64 Ed25519 signature of the bytes of the hex digest, or ""
// when key is nil (unsigned). Verify checks it with verifySig.
func signDigest(key ed25519.PrivateKey, digest string) string {
	if key == nil {
		return ""
	}
	raw, _ := hex.DecodeString(digest)
	return base64.StdEncoding.EncodeToString(ed25519.Sign(key, raw))
}

// appendJSONLine appends v's JSON as one line to the file at path (created 0600) and
// fsyncs it.
func appendJSONLine(path string, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readJSONLines returns the complete lines of file name in dir decoded as T, in order;
// a torn last line (a crash while appending) is ignored, and a missing file is no lines.
func readJSONLines[T any](dir, name string) ([]T, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []T
	for i, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 || line[len(line)-1] != '\n' {
			break
		}
		var v T
		if err := json.Unmarshal(line, &v); err != nil {
			return out, fmt.Errorf("audit: %s line %d: %w", name, i+1, err)
		}
		out = append(out, v)
	}
	return out, nil
}
