package execd

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

// handleListDirectory lists the entries below path up to depth levels (default 1), in
// lexical order per directory with descendants after their parent. Symbolic links are
// reported, never followed; a path that is itself a link is rejected (execd-api.yaml).
func (s *Server) handleListDirectory(w http.ResponseWriter, r *http.Request) {
	root, err := s.cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		depth, err = strconv.Atoi(v)
		if err != nil || depth < 0 {
			writeError(w, invalidf("depth %q is not a non-negative number", v))
			return
		}
		depth = max(depth, 1)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		writeError(w, notFound(root, err))
		return
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		writeError(w, invalidf("%q is a symbolic link: list the real directory", root))
		return
	}
	if !fi.IsDir() {
		writeError(w, invalidf("%q is not a directory", root))
		return
	}
	out := []FileInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		entries, err := os.ReadDir(dir) // sorted by name
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			info, err := e.Info()
			if err != nil {
				continue // vanished meanwhile
			}
			out = append(out, fileInfo(p, info))
			if e.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil && !errors.Is(err, fs.ErrPermission) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// handleMakeDirs creates each directory with its parents (mkdir -p), then applies the
// given owner, group and mode to it. All paths and modes are checked first.
func (s *Server) handleMakeDirs(w http.ResponseWriter, r *http.Request) {
	var req map[string]Permission
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	clean := make(map[string]Permission, len(req))
	for p, perm := range req {
		c, err := s.cleanPath(p)
		if err != nil {
			writeError(w, err)
			return
		}
		if perm.Mode != nil {
			if _, err := ParseMode(*perm.Mode); err != nil {
				writeError(w, err)
				return
			}
		}
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
			writeError(w, errorf(fs.ErrExist, "%q exists and is not a directory", c))
			return
		}
		clean[c] = perm
	}
	for p, perm := range clean {
		if err := os.MkdirAll(p, 0o755); err != nil {
			writeError(w, err)
			return
		}
		if err := applyPermission(p, perm); err != nil {
			writeError(w, err)
			return
		}
	}
	writeEmpty(w)
}

// handleDeleteDirs removes directories recursively (rm -rf). Every path must be an
// existing directory, and "/" is refused; all are checked before any is removed.
func (s *Server) handleDeleteDirs(w http.ResponseWriter, r *http.Request) {
	paths, err := s.queryPaths(r)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, p := range paths {
		if p == "/" {
			writeError(w, invalidf("refusing to delete /"))
			return
		}
		fi, err := os.Lstat(p)
		if err != nil {
			writeError(w, notFound(p, err))
			return
		}
		if !fi.IsDir() {
			writeError(w, invalidf("%q is not a directory: use DELETE /files", p))
			return
		}
	}
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			writeError(w, err)
			return
		}
	}
	writeEmpty(w)
}
