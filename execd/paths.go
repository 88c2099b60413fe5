package execd

import (
	"fmt"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// cleanPath turns a request path into a clean absolute path: relative paths are taken
// from the server's workdir, "." and ".." elements are resolved lexically. Empty paths
// and paths holding NUL bytes are invalid.
func (s *Server) cleanPath(p string) (string, error) {
	return CleanPath(s.cfg.Workdir, p)
}

// CleanPath is cleanPath with an explicit base directory (absolute).
func CleanPath(base, p string) (string, error) {
	if p == "" {
		return "", invalidf("path is empty")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalidf("path %q holds a NUL byte", p)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	return filepath.Clean(p), nil
}

// ParseMode reads a permission mode written the OpenSandbox way: octal digits sent as a
// decimal number (755 means 0755, 4755 means 04755). Digits 8 and 9 and values above
// 7777 are invalid.
func ParseMode(m int) (uint32, error) {
	if m < 0 || m > 7777 {
		return 0, invalidf("mode %d is not an octal permission (0..7777)", m)
	}
	v, err := strconv.ParseUint(strconv.Itoa(m), 8, 32)
	if err != nil {
		return 0, invalidf("mode %d is not an octal permission: digits must be 0-7", m)
	}
	return uint32(v), nil
}

// FormatMode is the inverse of ParseMode: 0755 becomes 755.
func FormatMode(perm uint32) int {
	n, _ := strconv.Atoi(strconv.FormatUint(uint64(perm&0o7777), 8))
	return n
}

// lookupUID resolves an owner name (or a numeric id) to a uid.
func lookupUID(name string) (int, error) {
	if u, err := user.Lookup(name); err == nil {
		return strconv.Atoi(u.Uid)
	}
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	return 0, invalidf("unknown user %q", name)
}

// lookupGID resolves a group name (or a numeric id) to a gid.
func lookupGID(name string) (int, error) {
	if g, err := user.LookupGroup(name); err == nil {
		return strconv.Atoi(g.Gid)
	}
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	return 0, invalidf("unknown group %q", name)
}

// userName resolves a uid to its name, or the number when the image has no entry.
func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

// groupName resolves a gid to its name, or the number when the image has no entry.
func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}

// primaryGroup returns the primary gid of uid from the image's passwd database.
func primaryGroup(uid uint32) (uint32, bool) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return 0, false
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	return uint32(g), err == nil
}

// homeDir returns the home directory of uid from the image's passwd database.
func homeDir(uid uint32) (string, bool) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil || u.HomeDir == "" {
		return "", false
	}
	return u.HomeDir, true
}

// ByteRange is a resolved byte range [Start, Start+Length) of a file.
type ByteRange struct {
	Start, Length int64
}

// ParseRange resolves an HTTP Range header (RFC 9110 §14.1.2) against a file of size
// bytes. Only single ranges are served: "bytes=a-b", "bytes=a-", "bytes=-n". It returns
// ok=false for an empty header; ErrRange when the range lies outside the file; ErrInvalid
// for syntax it cannot read or more than one range.
func ParseRange(header string, size int64) (r ByteRange, ok bool, err error) {
	if header == "" {
		return ByteRange{}, false, nil
	}
	spec, found := strings.CutPrefix(strings.TrimSpace(header), "bytes=")
	if !found {
		return ByteRange{}, false, invalidf("range %q: only byte ranges are served", header)
	}
	if strings.Contains(spec, ",") {
		return ByteRange{}, false, invalidf("range %q: only one range per request is served", header)
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return ByteRange{}, false, invalidf("range %q is malformed", header)
	}
	first, last = strings.TrimSpace(first), strings.TrimSpace(last)
	notSatisfiable := errorf(ErrRange, "range %q is outside the file (%d bytes)", header, size)
	if first == "" {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n < 0 {
			return ByteRange{}, false, invalidf("range %q is malformed", header)
		}
		if n == 0 || size == 0 {
			return ByteRange{}, false, notSatisfiable
		}
		n = min(n, size)
		return ByteRange{Start: size - n, Length: n}, true, nil
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return ByteRange{}, false, invalidf("range %q is malformed", header)
	}
	if start >= size {
		return ByteRange{}, false, notSatisfiable
	}
	end := size - 1
	if last != "" {
		e, err := strconv.ParseInt(last, 10, 64)
		if err != nil || e < start {
			return ByteRange{}, false, invalidf("range %q is malformed", header)
		}
		end = min(e, size-1)
	}
	return ByteRange{Start: start, Length: end - start + 1}, true, nil
}

// contentRange formats the Content-Range header of r in a file of size bytes.
func contentRange(r ByteRange, size int64) string {
	return fmt.Sprintf("bytes %d-%d/%d", r.Start, r.Start+r.Length-1, size)
}
