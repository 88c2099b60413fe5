// Package cgroupv2 finds cgroup v2 directories: where the unified hierarchy is mounted
// (/sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one) and which
// directory a process belongs to. eBPF socket programs attach to these directories:
// egressd finds each sandbox's (datapath.Spec.Cgroup) with OfPid.
package cgroupv2

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoCgroup2 means no cgroup2 filesystem is mounted in this mount namespace.
var ErrNoCgroup2 = errors.New("cgroupv2: no cgroup2 filesystem mounted")

// Mount returns the mount point of the cgroup2 filesystem, read from
// /proc/self/mountinfo. Errors: ErrNoCgroup2, or the read error.
func Mount() (string, error) {
	return mountFrom("/proc/self/mountinfo")
}

func mountFrom(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) > 0 && fs[0] == "cgroup2" {
			if f := strings.Fields(pre); len(f) >= 5 {
				return unescape(f[4]), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", ErrNoCgroup2
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OfPid returns the absolute cgroup v2 directory of process pid (the "0::" line of
// /proc/<pid>/cgroup under Mount()). Errors: ErrNoCgroup2, a process without a v2
// entry, or a read error (for example a process that exited).
func OfPid(pid int) (string, error) {
	mnt, err := Mount()
	if err != nil {
		return "", err
	}
	rel, err := relOf(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", err
	}
	return filepath.Join(mnt, rel), nil
}

func relOf(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Clean("/" + rel), nil
		}
	}
	return "", fmt.Errorf("cgroupv2: %s has no cgroup v2 entry", path)
}
