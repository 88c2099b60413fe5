package enforcer

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// benchCPUEnv names the CPU a bench's sandbox process (connect and stream children)
// runs on, pinned (pinThreads), while the test process, which serves the other end,
// is pinned to the rest: where the packets' softirq work is done, and so whose CPU
// time counts it, then no longer changes with the scheduler's placement from one
// measurement to the next.
const benchCPUEnv = "AIRLOCK_BENCH_CPU"

// pinThreads sets the CPU affinity of every thread of this process to cpus; threads
// made later inherit it from the thread that makes them.
func pinThreads(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pinning thread %d: %w", tid, err)
		}
	}
	return nil
}

// pinChild pins this process, a bench's child, to the CPU benchCPUEnv names, if any.
func pinChild() {
	if s := os.Getenv(benchCPUEnv); s != "" {
		if c, err := strconv.Atoi(s); err == nil {
			if err := pinThreads([]int{c}); err != nil {
				childFail(err)
			}
		}
	}
}

// childArgs sets up a child of this package's tests (the test binary run as a sandbox
// process): it pins it (pinChild) and moves it into the cgroup that the first field
// of the environment variable env names, and returns the variable's comma-separated
// fields.
func childArgs(env string) []string {
	pinChild()
	a := strings.Split(os.Getenv(env), ",")
	if err := os.WriteFile(filepath.Join(a[0], "cgroup.procs"), []byte("0"), 0); err != nil {
		childFail(err)
	}
	return a
}

// childFail ends a child whose set-up failed: "setup <err>" on stdout, which the
// parent reports, and exit status 1.
func childFail(err error) {
	fmt.Println("setup", err)
	os.Exit(1)
}

// pinBench pins the test process to every CPU but the first and its children (through
// benchCPUEnv, in its environment) to the first until the returned undo; nothing on a
// machine with one CPU.
func pinBench() (undo func(), err error) {
	n := runtime.NumCPU()
	if n < 2 {
		return func() {}, nil
	}
	rest, all := make([]int, 0, n-1), make([]int, 0, n)
	for c := range n {
		all = append(all, c)
		if c > 0 {
			rest = append(rest, c)
		}
	}
	if err := pinThreads(rest); err != nil {
		return nil, err
	}
	os.Setenv(benchCPUEnv, "0")
	return func() {
		os.Unsetenv(benchCPUEnv)
		_ = pinThreads(all)
	}, nil
}
