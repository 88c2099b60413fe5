package audit

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const crashDirEnv = "AIRLOCK_AUDIT_CRASH_DIR"

// TestCrashChildWriter is the child process of TestKill9: it writes records until it is
// killed, printing "synced <seq>" whenever the writer's fsync'd seq advances. It does
// nothing in a normal run.
func TestCrashChildWriter(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child process of TestKill9")
	}
	w, err := New(Config{Dir: dir, SyncInterval: 20 * time.Millisecond, MaxFileBytes: 1 << 20})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	var last uint64
	deadline := time.Now().Add(2 * time.Minute) // bounded even if the parent never kills
	for i := 0; time.Now().Before(deadline); i++ {
		for !w.TryAppend(rec("crash", i)) {
			time.Sleep(50 * time.Microsecond)
		}
		if i%500 == 0 {
			if s := w.Synced(); s != last {
				last = s
				fmt.Printf("synced %d\n", s)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	os.Exit(3)
}

// TestKill9 re-executes the test binary as a writer, SIGKILLs it mid-stream, and checks
// that every record the child reported as fsync'd is in the log, that the chain verifies
// up to the last complete record (a torn line is reported, not a break), and that a new
// writer continues the chain.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChildWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var synced uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "synced" {
			synced, _ = strconv.ParseUint(f[1], 10, 64)
			if synced >= 30_000 {
				break
			}
		}
	}
	if synced < 30_000 {
		t.Fatalf("child stopped before syncing 30000 records (last synced %d): %v", synced, sc.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL: %v", err)
	}

	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatalf("chain does not verify after kill -9: %v", err)
	}
	if rep.LastSeq < synced {
		t.Fatalf("log ends at seq %d but the child had fsync'd up to %d", rep.LastSeq, synced)
	}
	t.Logf("killed after synced=%d; log holds %d records (last seq %d), torn tail: %v", synced, rep.Records, rep.LastSeq, rep.TornTail)

	w, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(rec("after", 0))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep2, err := Verify(dir, VerifyOptions{})
	if err != nil || rep2.LastSeq != rep.LastSeq+1 || rep2.TornTail != nil {
		t.Fatalf("after restart: %+v %v", rep2, err)
	}
}
