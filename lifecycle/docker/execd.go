package docker

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
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

// encodeAuth encodes registry credentials for the engine's X-Registry-Auth header.
func encodeAuth(a *lifecycle.ImageAuth) (string, error) {
	b, err := json.Marshal(map[string]string{"username": a.Username, "password": a.Password})
	if err != nil {
		return "", err
	}
	return base64.URLEncoding.EncodeToString(b), nil
}
