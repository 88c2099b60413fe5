package cgroupv2

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockdev/airlock/internal/testenv"
)

func TestMountFrom(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "mountinfo")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hybrid := `25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`
	if got, err := mountFrom(write(hybrid)); err != nil || got != "/sys/fs/cgroup/unified" {
		t.Fatalf("hybrid: %q %v", got, err)
	}
	if got, err := mountFrom(write(`40 1 0:30 / /my\040cg rw - cgroup2 none rw` + "\n")); err != nil || got != "/my cg" {
		t.Fatalf("escaped: %q %v", got, err)
	}
	if _, err := mountFrom(write("33 31 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")); err != ErrNoCgroup2 {
		t.Fatalf("v1 only: %v", err)
	}
}

func TestRelOf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cgroup")
	os.WriteFile(p, []byte("9:name=systemd:/docker/abc\n0::/docker/abc\n"), 0o600)
	if got, err := relOf(p); err != nil || got != "/docker/abc" {
		t.Fatalf("%q %v", got, err)
	}
	os.WriteFile(p, []byte("4:memory:/x\n"), 0o600)
	if _, err := relOf(p); err == nil {
		t.Fatal("v1-only process: want an error")
	}
}

func TestOfPidSelf(t *testing.T) {
	if _, err := Mount(); err != nil {
		testenv.SkipOrFail(t, "no cgroup v2 here: "+err.Error())
	}
	dir, err := OfPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s: %v", dir, err)
	}
}

// TestIsRoot: the hierarchy's mount is the root, a directory below it is not.
func TestIsRoot(t *testing.T) {
	mnt, err := Mount()
	if err != nil {
		testenv.SkipOrFail(t, "no cgroup v2 here: "+err.Error())
	}
	if !IsRoot(mnt) || !IsRoot(mnt+"/") {
		t.Errorf("IsRoot(%q) = false", mnt)
	}
	if IsRoot(filepath.Join(mnt, "airlock", "x")) {
		t.Errorf("a directory below the root counted as the root")
	}
}
