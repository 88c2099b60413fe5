package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/moby/moby/client"

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

// TokenPath is where a sandbox's execd token waits for execd (execd
// --access-token-file), which reads and removes it before anything else in the sandbox
// starts. Its folder and the file belong to the container's user (mode 0700 and 0400),
// so that execd may remove it whatever user the image runs as.
const TokenPath = "/opt/airlock/run/execd-token"

// tokenArchive is a tar archive holding token at TokenPath, for CopyToContainer at "/".
func tokenArchive(token string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dir := strings.TrimPrefix(path.Dir(TokenPath), "/") + "/"
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o700, ModTime: now}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(TokenPath, "/"), Mode: 0o400, Size: int64(len(token)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write([]byte(token)); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// installToken copies the sandbox's execd token into the created container (TokenPath),
// owned by the container's user (CopyUIDGID).
func (r *Runtime) installToken(ctx context.Context, id, token string) error {
	tar, err := tokenArchive(token)
	if err != nil {
		return err
	}
	if _, err := r.cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{
		DestinationPath: "/", Content: bytes.NewReader(tar), CopyUIDGID: true,
	}); err != nil {
		return fmt.Errorf("docker: copying the execd token into the container: %w", err)
	}
	return nil
}

// encodeAuth encodes registry credentials for the engine's X-Registry-Auth header.
func encodeAuth(a *lifecycle.ImageAuth) (string, error) {
	b, err := json.Marshal(map[string]string{"username": a.Username, "password": a.Password})
	if err != nil {
		return "", err
	}
	return base64.URLEncoding.EncodeToString(b), nil
}
