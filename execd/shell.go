package execd

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// shell is a long-lived bash process that runs one script at a time and keeps its state
// (working directory, variables, functions, aliases) between runs. Stdout and stderr share
// one pipe; each run ends with a marker line carrying its exit status.
type shell struct {
	procs *Procs
	cmd   *exec.Cmd
	pid   int
	stdin io.WriteCloser
	out   *os.File
	lines chan string
	dead  chan struct{}
	mark  string

	mu sync.Mutex // held for the length of a run
}

// errShellExited is what a run reports when the shell itself ended (exit in a command).
var errShellExited = fmt.Errorf("the shell exited")

// startShell starts a bash in dir with env (the server's preparation rules apply).
func (s *Server) startShell(dir string) (*shell, error) {
	if s.shell == "" || !strings.HasSuffix(s.shell, "bash") {
		return nil, errorf(ErrUnavailable, "this image has no bash for sessions")
	}
	cmd := exec.Command(s.shell, "--noprofile", "--norc")
	if err := s.prepareCmd(cmd, dir, nil, nil, nil); err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, outW
	err = s.procs.Start(cmd)
	outW.Close()
	if err != nil {
		outR.Close()
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	sh := &shell{
		procs: s.procs, cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, out: outR,
		lines: make(chan string, 64), dead: make(chan struct{}), mark: "__EXECD_DONE_" + newID() + "_",
	}
	go func() {
		splitLines(outR, func(l string) { sh.lines <- l })
		close(sh.lines)
	}()
	go func() {
		s.procs.Wait(cmd)
		close(sh.dead)
	}()
	// A trapped SIGINT ends the running script (the trap returns from the function that
	// runs it, which stops a loop of builtins too) but not the shell; between scripts
	// it does nothing. Variables the script sets stay global.
	if _, err := io.WriteString(stdin, "trap 'return 130 2>/dev/null' INT\n"+runFunc+"() { eval \"$1\"; }\n"); err != nil {
		sh.close()
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	return sh, nil
}

// runFunc is the shell function that runs each script.
const runFunc = "__execd_run"

// quoteShell quotes s as one single-quoted bash word.
func quoteShell(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// run executes script in the shell (after `cd dir` when dir is set), calling emit for
// every output line, and returns the exit status. Cancelling ctx or reaching timeout (0:
// none) interrupts the script with SIGINT; a script that ignores it is killed with its
// shell after a grace time. It fails with ErrBusy while another run is active.
func (sh *shell) run(ctx context.Context, script, dir string, timeout time.Duration, emit func(string)) (int, error) {
	if !sh.mu.TryLock() {
		return 0, errorf(ErrBusy, "the shell is already running a command")
	}
	defer sh.mu.Unlock()
	select {
	case <-sh.dead:
		return 0, errorf(ErrClosed, "the shell has exited")
	default:
	}
	var b strings.Builder
	if dir != "" {
		b.WriteString("cd -- " + quoteShell(dir) + " && ")
	}
	b.WriteString(runFunc + " " + quoteShell(script) + " </dev/null\n")
	b.WriteString("printf '%s%d\\n' " + quoteShell(sh.mark) + " \"$?\"\n")
	if _, err := io.WriteString(sh.stdin, b.String()); err != nil {
		return 0, errorf(ErrClosed, "the shell has exited")
	}
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	done := ctx.Done()
	var kill <-chan time.Time
	for {
		select {
		case line, ok := <-sh.lines:
			if !ok {
				return -1, errShellExited
			}
			if i := strings.Index(line, sh.mark); i >= 0 {
				if i > 0 {
					emit(line[:i])
				}
				code, err := strconv.Atoi(line[i+len(sh.mark):])
				if err != nil {
					return -1, fmt.Errorf("unreadable exit status %q", line[i+len(sh.mark):])
				}
				return code, nil
			}
			emit(line)
		case <-sh.dead:
			sh.drain(emit)
			return -1, errShellExited
		case <-done:
			done = nil
			sh.interrupt()
			kill = time.After(interruptGrace)
		case <-timer:
			timer = nil
			sh.interrupt()
			kill = time.After(interruptGrace)
		case <-kill:
			kill = nil
			signalGroup(sh.pid, syscall.SIGKILL)
		}
	}
}

// drain emits the lines already read after the shell died.
func (sh *shell) drain(emit func(string)) {
	for {
		select {
		case line, ok := <-sh.lines:
			if !ok {
				return
			}
			if !strings.Contains(line, sh.mark) {
				emit(line)
			}
		default:
			return
		}
	}
}

// interrupt sends SIGINT to the shell's process group: the running command ends, the
// shell (which traps SIGINT) goes on.
func (sh *shell) interrupt() { signalGroup(sh.pid, syscall.SIGINT) }

// close kills the shell and everything in its process group.
func (sh *shell) close() {
	signalGroup(sh.pid, syscall.SIGKILL)
	sh.stdin.Close()
	go func() {
		<-sh.dead
		sh.out.Close()
		for range sh.lines {
		}
	}()
}
