package execd

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// errClosedPipe is what a read on a pipe that execd closed returns.
var errClosedPipe = os.ErrClosed

// Procs tracks the processes execd starts itself, so that the orphan reaper of PID 1
// mode never steals the exit status that an exec.Cmd's Wait is waiting for. Start every
// child through Start and wait for it through Wait. The zero value is ready to use.
type Procs struct {
	mu   sync.RWMutex // starting holds it shared, reaping exclusively
	own  sync.Map     // pid -> struct{}
	self int
}

// Start starts cmd and records its pid as execd's own.
func (p *Procs) Start(cmd *exec.Cmd) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.own.Store(cmd.Process.Pid, struct{}{})
	return nil
}

// Wait waits for cmd (started with Start) and forgets its pid.
func (p *Procs) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	p.own.Delete(cmd.Process.Pid)
	return err
}

// ReapOrphans collects every zombie child of this process that execd did not start
// itself (orphans re-parented to PID 1 or to a child subreaper). It reads /proc, so it
// costs one directory scan; it returns the number reaped.
func (p *Procs) ReapOrphans() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.self == 0 {
		p.self = os.Getpid()
	}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ours := p.own.Load(pid); ours {
			continue
		}
		state, ppid, ok := procStat(pid)
		if !ok || ppid != p.self || state != 'Z' {
			continue
		}
		var ws syscall.WaitStatus
		if got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n
}

// procStat returns the state letter and parent pid of pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses; cut at the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	fields := bytes.Fields(b[i+2:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(fields[1]))
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], ppid, true
}

// signalGroup sends sig to the process group led by pid (execd starts every command in
// its own group), falling back to the process alone.
func signalGroup(pid int, sig syscall.Signal) {
	if err := syscall.Kill(-pid, sig); err != nil {
		syscall.Kill(pid, sig)
	}
}
