package lctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProcessTempDir: a directory of a process that is gone is removed, one of a live
// process (this one) is kept, and the new one names this process.
func TestProcessTempDir(t *testing.T) {
	prefix := fmt.Sprintf("airlock-lctest-%d-", os.Getpid()) // no other run shares it
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-x", prefix, done.Process.Pid))
	live := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-y", prefix, os.Getpid()))
	other := filepath.Join(os.TempDir(), prefix+"notapid")
	for _, d := range []string{dead, live, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	dir, err := processTempDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the gone process's directory is still there: %v", err)
	}
	for _, d := range []string{live, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	if !strings.HasPrefix(filepath.Base(dir), fmt.Sprintf("%s%d-", prefix, os.Getpid())) {
		t.Errorf("new directory %s does not name this process", dir)
	}
}
