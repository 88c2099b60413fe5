// Package cgroupv2 finds cgroup v2 directories: where the unified hierarchy is mounted
// (/sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one) and which
// directory a process belongs to. eBPF socket programs attach to these directories:
// egressd finds each sandbox's (datapath.Spec.Cgroup) with OfPid; lifecycle/docker moves a gVisor
// Sentry into a directory of its own (Adopt). It lives under internal/ because both the
// control plane and the data plane use it.
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

// IsRoot reports whether dir is the root of the cgroup2 hierarchy (Mount()): a
// directory holding every process on the host that has no cgroup of its own, where no
// per-sandbox program may ever attach.
func IsRoot(dir string) bool {
	mnt, err := Mount()
	return err == nil && filepath.Clean(dir) == filepath.Clean(mnt)
}

// Adopt gives process pid a cgroup v2 directory of its own, Mount()/name, when it has
// none. On a hybrid host (v1 controllers, the v2 hierarchy at /sys/fs/cgroup/unified)
// a runtime that joins only the v1 hierarchies, such as Debian 12's gVisor runsc (its
// sandbox process is the Sentry, which makes the network system calls), leaves the
// process in the v2 root, where no per-sandbox eBPF program can attach; runc places
// its containers in both. The move takes the whole thread group (cgroup.procs); the
// v2 hierarchy of a hybrid host has no controllers, so nothing else changes for the
// process. It returns the process's directory afterwards and whether it moved it; a
// process already below the root is left where it is. Errors: ErrNoCgroup2, or the
// read, mkdir or write error.
func Adopt(pid int, name string) (dir string, moved bool, err error) {
	mnt, err := Mount()
	if err != nil {
		return "", false, err
	}
	rel, err := relOf(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", false, err
	}
	if rel != "/" {
		return filepath.Join(mnt, rel), false, nil
	}
	dir = filepath.Join(mnt, filepath.Clean("/"+name))
	if dir == filepath.Clean(mnt) {
		return "", false, fmt.Errorf("cgroupv2: %q names the root", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("cgroupv2: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		os.Remove(dir)
		return "", false, fmt.Errorf("cgroupv2: moving pid %d to %s: %w", pid, dir, err)
	}
	return dir, true, nil
}

// Release removes the directory Adopt made under name once its processes have exited;
// a missing directory is not an error (Adopt had nothing to do). A cgroup that still
// holds a process cannot be removed (EBUSY).
func Release(name string) error {
	mnt, err := Mount()
	if err != nil {
		return nil
	}
	dir := filepath.Join(mnt, filepath.Clean("/"+name))
	if dir == filepath.Clean(mnt) {
		return nil
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroupv2: %w", err)
	}
	return nil
}
