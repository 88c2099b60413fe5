package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// minAuditFree is the free space below which the audit row is degraded whatever the
// retention: the log needs room for at least a few files.
const minAuditFree = 1 << 30

// auditDisk is the "audit log" row: what the log takes, its retention, and whether
// the file system holding it has room for what retention lets it grow to.
func (c *checker) auditDisk() Row {
	r := Row{Check: "audit log disk", Status: OK}
	dir := c.cfg.AuditDir
	var used int64
	files := 0
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		r.Status, r.Detail = Degraded, fmt.Sprintf("%s: %v", dir, err)
		r.Fix = "make the audit directory readable (run as root)"
		return r
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			used += fi.Size()
			if strings.HasPrefix(e.Name(), "audit-") {
				files++
			}
		}
	}
	free, err := freeBytes(dir)
	if err != nil {
		r.Status, r.Detail = Degraded, fmt.Sprintf("%s: free space unknown: %v", dir, err)
		return r
	}
	ret := "no size limit"
	if c.cfg.AuditMaxBytes > 0 {
		ret = "limit " + humanBytes(c.cfg.AuditMaxBytes)
	}
	if c.cfg.AuditMaxAge > 0 {
		ret += fmt.Sprintf(", %d days", int(c.cfg.AuditMaxAge/(24*time.Hour)))
	}
	r.Detail = fmt.Sprintf("%s: %s in %d files (retention: %s); %s free", dir, humanBytes(used), files, ret, humanBytes(int64(free)))
	switch {
	case c.cfg.AuditMaxBytes <= 0 && free < minAuditFree:
		r.Status, r.Fix = Degraded, "free disk space, or set audit.retention.maxBytes"
	case c.cfg.AuditMaxBytes > 0 && int64(free) < max(c.cfg.AuditMaxBytes-used, minAuditFree):
		r.Status = Degraded
		r.Fix = fmt.Sprintf("free disk space, or lower audit.retention.maxBytes to fit the %s free", humanBytes(int64(free)))
	}
	return r
}

// freeBytes is the space available to unprivileged users on the file system of dir
// (or of its nearest existing parent).
func freeBytes(dir string) (uint64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			return uint64(st.Bavail) * uint64(st.Bsize), nil
		}
		parent := filepath.Dir(dir)
		if !os.IsNotExist(err) || parent == dir {
			return 0, err
		}
		dir = parent
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
