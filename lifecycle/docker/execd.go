package docker

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/airlockdev/airlock/lifecycle"
)

// execdArchive reads the execd binary at path and returns a tar archive holding it at
// opt/airlock/execd (mode 0755, root), ready for CopyToContainer at "/".
func execdArchive(path string) ([]byte, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("docker: reading execd: %w", err)
	}
	if len(bin) < 4 || string(bin[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("docker: %s is not an ELF binary (build execd with CGO_ENABLED=0)", path)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, d := range []string{"opt/", "opt/airlock/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: now}); err != nil {
			return nil, err
		}
	}
	name := strings.TrimPrefix(ExecdPath, "/")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(bin)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tokenFlags is execd's token option for a sandbox's execd token: its SHA-256 in hex
// (--access-token-sha256), so the token itself is nowhere in the sandbox, not even in
// execd's memory, and the engine writes nothing into the container for it (a copy into
// a created container costs the engine a rootfs mount and a re-exec of dockerd, about
// 65 ms of CPU a sandbox, which a fork of ten pays ten times on a small host). The
// token is 256 bits of HMAC output (internal/execdtoken), so the digest, readable in
// the sandbox's /proc/1/cmdline and in `docker inspect`, does not reveal it; execd
// compares each request's token's digest (execd/README.md). Empty token: no flags.
func tokenFlags(token string) []string {
	if token == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(token))
	return []string{"--access-token-sha256", hex.EncodeToString(sum[:])}
}

// encodeAuth encodes registry credentials for the engine's X-Registry-Auth header.
func encodeAuth(a *lifecycle.ImageAuth) (string, error) {
	b, err := json.Marshal(map[string]string{"username": a.Username, "password": a.Password})
	if err != nil {
		return "", err
	}
	return base64.URLEncoding.EncodeToString(b), nil
}
