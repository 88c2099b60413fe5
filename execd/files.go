package execd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FileInfo is the metadata of one path (FileInfo in execd-api.yaml). Mode is octal digits
// written as a decimal number (0755 is 755); owner and group are names.
type FileInfo struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file, directory, symlink, other
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	CreatedAt  time.Time `json:"created_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	Mode       int       `json:"mode"`
}

// Permission is the owner, group and mode to give a path (Permission in execd-api.yaml).
// A nil Mode or an empty Owner/Group leaves that attribute as it is.
type Permission struct {
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	Mode  *int   `json:"mode,omitempty"`
}

// fileInfo builds the FileInfo of path from an Lstat result.
func fileInfo(path string, fi fs.FileInfo) FileInfo {
	info := FileInfo{Path: path, Size: fi.Size(), ModifiedAt: fi.ModTime().UTC(), CreatedAt: fi.ModTime().UTC()}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = "file"
	case m.IsDir():
		info.Type = "directory"
	case m&fs.ModeSymlink != 0:
		info.Type = "symlink"
	default:
		info.Type = "other"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = FormatMode(st.Mode)
		info.Owner, info.Group = userName(st.Uid), groupName(st.Gid)
		info.CreatedAt = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	} else {
		info.Mode = FormatMode(uint32(fi.Mode().Perm()))
	}
	return info
}

// queryPaths reads every `path` query parameter, cleaned; at least one is required.
func (s *Server) queryPaths(r *http.Request) ([]string, error) {
	raw := r.URL.Query()["path"]
	if len(raw) == 0 {
		return nil, invalidf("query parameter path is required")
	}
	out := make([]string, 0, len(raw))
	for _, p := range raw {
		c, err := s.cleanPath(p)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// notFound rewrites a missing-file error as ErrNotFound with the path in the message.
func notFound(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errorf(ErrNotFound, "file %q not found", path)
	}
	return err
}

func (s *Server) handleFilesInfo(w http.ResponseWriter, r *http.Request) {
	paths, err := s.queryPaths(r)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make(map[string]FileInfo, len(paths))
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			writeError(w, notFound(p, err))
			return
		}
		out[p] = fileInfo(p, fi)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleDeleteFiles removes files (never directories). Every path is checked before any
// is removed.
func (s *Server) handleDeleteFiles(w http.ResponseWriter, r *http.Request) {
	paths, err := s.queryPaths(r)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			writeError(w, notFound(p, err))
			return
		}
		if fi.IsDir() {
			writeError(w, invalidf("%q is a directory: use DELETE /directories", p))
			return
		}
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			writeError(w, err)
			return
		}
	}
	writeEmpty(w)
}

// applyPermission sets owner, group and mode of path; mode is in the decimal-octal form.
func applyPermission(path string, p Permission) error {
	uid, gid := -1, -1
	var err error
	if p.Owner != "" {
		if uid, err = lookupUID(p.Owner); err != nil {
			return err
		}
	}
	if p.Group != "" {
		if gid, err = lookupGID(p.Group); err != nil {
			return err
		}
	}
	var mode uint32
	if p.Mode != nil {
		if mode, err = ParseMode(*p.Mode); err != nil {
			return err
		}
	}
	if uid >= 0 || gid >= 0 {
		if err := os.Lchown(path, uid, gid); err != nil {
			return notFound(path, err)
		}
	}
	if p.Mode != nil {
		if err := os.Chmod(path, fileModeOf(mode)); err != nil {
			return notFound(path, err)
		}
	}
	return nil
}

// fileModeOf converts Unix permission bits (with setuid/setgid/sticky) to fs.FileMode.
func fileModeOf(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

func (s *Server) handlePermissions(w http.ResponseWriter, r *http.Request) {
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
		if _, err := os.Lstat(c); err != nil {
			writeError(w, notFound(c, err))
			return
		}
		clean[c] = perm
	}
	for p, perm := range clean {
		if err := applyPermission(p, perm); err != nil {
			writeError(w, err)
			return
		}
	}
	writeEmpty(w)
}

// renameItem is one entry of POST /files/mv.
type renameItem struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
}

func (s *Server) handleMove(w http.ResponseWriter, r *http.Request) {
	var req []renameItem
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	for _, it := range req {
		src, err := s.cleanPath(it.Src)
		if err != nil {
			writeError(w, err)
			return
		}
		dest, err := s.cleanPath(it.Dest)
		if err != nil {
			writeError(w, err)
			return
		}
		if _, err := os.Lstat(src); err != nil {
			writeError(w, notFound(src, err))
			return
		}
		if fi, err := os.Stat(filepath.Dir(dest)); err != nil || !fi.IsDir() {
			writeError(w, errorf(ErrNotFound, "target directory %q does not exist", filepath.Dir(dest)))
			return
		}
		if err := os.Rename(src, dest); err != nil {
			writeError(w, fmt.Errorf("moving %q to %q: %w", src, dest, err))
			return
		}
	}
	writeEmpty(w)
}

// handleSearch walks path recursively and answers every file whose base name matches
// pattern (a shell glob; "**", "*" or empty match all). A pattern with slashes is matched
// by its last element (NOTES.md: search globs the basename).
func (s *Server) handleSearch(w http.ResponseWriter, r *http.Request) {
	root, err := s.cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	pattern := r.URL.Query().Get("pattern")
	if i := strings.LastIndexByte(pattern, '/'); i >= 0 {
		pattern = pattern[i+1:]
	}
	if pattern == "**" || pattern == "" {
		pattern = "*"
	}
	pattern = strings.ReplaceAll(pattern, "**", "*")
	if _, err := filepath.Match(pattern, ""); err != nil {
		writeError(w, invalidf("pattern %q is not a valid glob", r.URL.Query().Get("pattern")))
		return
	}
	fi, err := os.Stat(root)
	if err != nil {
		writeError(w, notFound(root, err))
		return
	}
	if !fi.IsDir() {
		writeError(w, invalidf("%q is not a directory", root))
		return
	}
	out := []FileInfo{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil // unreadable directories are skipped, not fatal
		}
		if ok, _ := filepath.Match(pattern, d.Name()); !ok {
			return nil
		}
		if info, err := d.Info(); err == nil {
			out = append(out, fileInfo(p, info))
		}
		return nil
	})
	writeJSON(w, http.StatusOK, out)
}

// replaceItem is one entry of POST /files/replace.
type replaceItem struct {
	Old string `json:"old"`
	New string `json:"new"`
}

// replaceResult is the per-file answer of POST /files/replace?verbose=true.
type replaceResult struct {
	ReplacedCount int `json:"replacedCount"`
}

// maxReplaceSize bounds the files /files/replace rewrites (they are edited in memory).
const maxReplaceSize = 256 << 20

func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request) {
	var req map[string]replaceItem
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	clean := make(map[string]replaceItem, len(req))
	for p, it := range req {
		c, err := s.cleanPath(p)
		if err != nil {
			writeError(w, err)
			return
		}
		if it.Old == "" {
			writeError(w, invalidf("old must not be empty (file %q)", c))
			return
		}
		fi, err := os.Stat(c)
		if err != nil {
			writeError(w, notFound(c, err))
			return
		}
		if !fi.Mode().IsRegular() {
			writeError(w, invalidf("%q is not a regular file", c))
			return
		}
		if fi.Size() > maxReplaceSize {
			writeError(w, invalidf("%q is larger than %d bytes", c, maxReplaceSize))
			return
		}
		clean[c] = it
	}
	out := make(map[string]replaceResult, len(clean))
	for p, it := range clean {
		n, err := replaceInFile(p, it.Old, it.New)
		if err != nil {
			writeError(w, err)
			return
		}
		out[p] = replaceResult{ReplacedCount: n}
	}
	if v, _ := strconv.ParseBool(r.URL.Query().Get("verbose")); v {
		writeJSON(w, http.StatusOK, out)
		return
	}
	writeEmpty(w)
}

// replaceInFile replaces every occurrence of old by new in path, keeping its mode and
// owner (the new content is written beside it and renamed over it). It returns the count.
func replaceInFile(path, old, new string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, notFound(path, err)
	}
	n := bytes.Count(data, []byte(old))
	if n == 0 {
		return 0, nil
	}
	data = bytes.ReplaceAll(data, []byte(old), []byte(new))
	return n, writeFileAtomic(path, bytes.NewReader(data))
}

// writeFileAtomic writes r to a temporary file beside path and renames it over path,
// keeping path's mode and owner when it exists.
func writeFileAtomic(path string, r io.Reader) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".execd-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return err
	}
	if fi, err := os.Stat(path); err == nil {
		tmp.Chmod(fi.Mode())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			tmp.Chown(int(st.Uid), int(st.Gid))
		}
	} else {
		tmp.Chmod(0o644)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// handleDownload streams a file. A Range header (one range) answers 206 with
// Content-Range; the SDK's offset/limit query parameters select a window too.
func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	p, err := s.cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeError(w, notFound(p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, err)
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, invalidf("%q is not a regular file", p))
		return
	}
	size := fi.Size()
	rng, partial, err := ParseRange(r.Header.Get("Range"), size)
	if err != nil {
		writeError(w, err)
		return
	}
	if !partial {
		rng = ByteRange{Start: 0, Length: size}
		if v := r.URL.Query().Get("offset"); v != "" {
			off, err := strconv.ParseInt(v, 10, 64)
			if err != nil || off < 0 {
				writeError(w, invalidf("offset %q is not a byte offset", v))
				return
			}
			rng.Start = min(off, size)
			rng.Length = size - rng.Start
		}
		if v := r.URL.Query().Get("limit"); v != "" {
			lim, err := strconv.ParseInt(v, 10, 64)
			if err != nil || lim < 0 {
				writeError(w, invalidf("limit %q is not a byte count", v))
				return
			}
			rng.Length = min(rng.Length, lim)
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", filepath.Base(p)))
	h.Set("Accept-Ranges", "bytes")
	h.Set("Content-Length", strconv.FormatInt(rng.Length, 10))
	if partial {
		h.Set("Content-Range", contentRange(rng, size))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	if r.Method == http.MethodHead {
		return
	}
	io.Copy(w, io.NewSectionReader(f, rng.Start, rng.Length))
}
