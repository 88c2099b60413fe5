package execd

import (
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
)

// maxMetadata bounds the JSON metadata part of an upload.
const maxMetadata = 64 << 10

// FileMetadata is the JSON `metadata` part of an upload (FileMetadata in execd-api.yaml):
// the target path and, optionally, owner and group names and a decimal-octal mode.
type FileMetadata struct {
	Path  string `json:"path"`
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	Mode  *int   `json:"mode,omitempty"`
}

// readUpload reads a multipart upload body: pairs of a `metadata` part (JSON
// FileMetadata) followed by a `file` part, in that order (NOTES.md). For every pair it
// calls save with the metadata and the file part's content, which save must consume as a
// stream. Parts with other names are skipped. It returns the number of files saved;
// ErrInvalid for a malformed body, a file without metadata, metadata without a file, or
// no file at all.
func readUpload(mr *multipart.Reader, save func(FileMetadata, io.Reader) error) (int, error) {
	var pending *FileMetadata
	n := 0
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, invalidf("reading the multipart body: %v", err)
		}
		switch part.FormName() {
		case "metadata":
			if pending != nil {
				return n, invalidf("metadata for %q is not followed by a file part", pending.Path)
			}
			b, err := io.ReadAll(io.LimitReader(part, maxMetadata+1))
			if err != nil {
				return n, invalidf("reading the metadata part: %v", err)
			}
			if len(b) > maxMetadata {
				return n, invalidf("the metadata part is larger than %d bytes", maxMetadata)
			}
			var m FileMetadata
			if err := json.Unmarshal(b, &m); err != nil {
				return n, invalidf("the metadata part is not JSON FileMetadata: %v", err)
			}
			if m.Path == "" {
				return n, invalidf("the metadata part has no path")
			}
			if m.Mode != nil {
				if _, err := ParseMode(*m.Mode); err != nil {
					return n, err
				}
			}
			pending = &m
		case "file":
			if pending == nil {
				return n, invalidf("a file part arrived before its metadata part")
			}
			if err := save(*pending, part); err != nil {
				return n, err
			}
			pending = nil
			n++
		}
		part.Close()
	}
	if pending != nil {
		return n, invalidf("metadata for %q is not followed by a file part", pending.Path)
	}
	if n == 0 {
		return 0, invalidf("the upload holds no file part")
	}
	return n, nil
}

// handleUpload stores each uploaded file, streamed to disk: parents are created, the
// content lands in a temporary file beside the target and is renamed over it, then
// owner, group and mode are applied.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, invalidf("the upload must be multipart/form-data: %v", err))
		return
	}
	_, err = readUpload(mr, func(m FileMetadata, body io.Reader) error {
		p, err := s.cleanPath(m.Path)
		if err != nil {
			return err
		}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return invalidf("%q is a directory", p)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("creating the parents of %q: %w", p, err)
		}
		if err := writeFileAtomic(p, body); err != nil {
			return fmt.Errorf("writing %q: %w", p, err)
		}
		return applyPermission(p, Permission{Owner: m.Owner, Group: m.Group, Mode: m.Mode})
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeEmpty(w)
}
