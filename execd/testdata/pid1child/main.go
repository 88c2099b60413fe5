// Command pid1child is the entrypoint of execd's PID 1 test image (an image with no
// shell). Started without arguments it leaves three orphans behind (their pids go to
// /tmp/orphans, one per line; they exit soon and must be reaped by PID 1), then waits
// for SIGTERM and exits with status 42.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	self, _ := os.Executable()
	switch {
	case len(os.Args) > 1 && os.Args[1] == "orphan-parent":
		var pids []string
		for range 3 {
			c := exec.Command(self, "orphan")
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			pids = append(pids, fmt.Sprint(c.Process.Pid))
		}
		os.WriteFile("/tmp/orphans.tmp", []byte(strings.Join(pids, "\n")+"\n"), 0o644)
		os.Rename("/tmp/orphans.tmp", "/tmp/orphans")
		os.Exit(0) // without waiting: the three are re-parented to PID 1
	case len(os.Args) > 1 && os.Args[1] == "orphan":
		time.Sleep(300 * time.Millisecond)
		os.Exit(0)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	if err := exec.Command(self, "orphan-parent").Run(); err != nil {
		fmt.Fprintln(os.Stderr, "orphan-parent:", err)
	}
	<-sigs
	fmt.Println("pid1child: SIGTERM received, exiting 42")
	os.Exit(42)
}
