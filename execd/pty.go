package execd

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// Interactive PTY sessions (docs/spec/execd-pty.md): POST /pty creates a session, its
// shell starts on the first WebSocket (ptyws.go) in PTY or pipe mode, output is kept for
// replay, one WebSocket holds the session at a time.

// CreatePTYRequest is the optional body of POST /pty. Cwd is the shell's directory
// (created when missing; default the workdir); Command, when set, is run as
// `<shell> -c <command>` instead of an interactive shell.
type CreatePTYRequest struct {
	Cwd     string `json:"cwd,omitempty"`
	Command string `json:"command,omitempty"`
}

// CreatePTYResponse is the answer of POST /pty (201).
type CreatePTYResponse struct {
	SessionID string `json:"session_id"`
}

// PTYStatus is the answer of GET /pty/{id}. OutputOffset is the number of bytes the
// session has output so far (the since= of a reconnect that wants nothing again).
type PTYStatus struct {
	SessionID       string `json:"session_id"`
	Running         bool   `json:"running"`
	OutputOffset    int64  `json:"output_offset"`
	LaunchAttempted bool   `json:"launch_attempted"`
	LaunchFailed    bool   `json:"launch_failed"`
}

// ptyDrainWait is how long, once the shell exited, execd keeps reading output that its
// leftover children may still write before it closes the terminal.
const ptyDrainWait = 250 * time.Millisecond

// ptySession is one session: its shell (started and restarted by WebSockets), its output
// log and its current holder.
type ptySession struct {
	id      string
	dir     string
	command string
	out     *outputLog

	mu       sync.Mutex
	attempts bool // a start was attempted
	failed   bool // the latest start failed
	running  bool
	isPTY    bool
	pid      int
	tty      *os.File       // terminal master (PTY mode)
	stdin    io.WriteCloser // terminal master or stdin pipe
	done     chan struct{}  // closed once the shell exited and its output is in out
	exitCode int
	closed   bool
	holder   *ptyConn
}

// DefaultMaxPTYSessions is Config.MaxPTYSessions when zero: a terminal per tab of a
// few clients, with room to spare, and at most 16 × PTYReplayBytes of replay buffers.
const DefaultMaxPTYSessions = 16

// ptySessions is the registry of PTY sessions.
type ptySessions struct {
	mu   sync.Mutex
	byID map[string]*ptySession
	max  int // < 0: no limit
}

// add registers p unless the registry is full (ErrLimit).
func (ps *ptySessions) add(p *ptySession) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.max >= 0 && len(ps.byID) >= ps.max {
		return errorf(ErrLimit, "this sandbox has %d pty sessions, its limit: delete one first (DELETE /pty/{id})", len(ps.byID))
	}
	ps.byID[p.id] = p
	return nil
}

func (ps *ptySessions) get(id string) (*ptySession, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.byID[id]; ok {
		return p, nil
	}
	return nil, errorf(ErrNotFound, "pty session %q not found", id)
}

func (ps *ptySessions) close() {
	ps.mu.Lock()
	all := ps.byID
	ps.byID = map[string]*ptySession{}
	ps.mu.Unlock()
	for _, p := range all {
		p.close()
	}
}

// start starts the session's shell in PTY or pipe mode unless it runs already; it
// returns whether this call started it.
func (s *Server) startPTY(p *ptySession, usePTY bool) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false, errorf(ErrClosed, "pty session %q was deleted", p.id)
	}
	if p.running {
		return false, nil
	}
	p.attempts = true
	err := s.launchPTY(p, usePTY)
	p.failed = err != nil
	return err == nil, err
}

// launchPTY starts the shell; p.mu is held.
func (s *Server) launchPTY(p *ptySession, usePTY bool) error {
	if s.shell == "" {
		return errorf(ErrUnavailable, "this image has no shell for pty sessions")
	}
	var args []string
	if p.command != "" {
		args = []string{"-c", p.command}
	}
	cmd := exec.Command(s.shell, args...)
	if err := s.prepareCmd(cmd, p.dir, nil, nil, nil); err != nil {
		return err
	}
	var readers []*os.File
	var closeAfterStart []*os.File
	if usePTY {
		if !hasEnv(cmd.Env, "TERM") {
			cmd.Env = append(cmd.Env, "TERM=xterm-256color")
		}
		master, tty, err := openTerminal()
		if err != nil {
			return fmt.Errorf("opening a terminal: %w", err)
		}
		if err := setWinsize(master, 80, 24); err != nil {
			master.Close()
			tty.Close()
			return fmt.Errorf("sizing the terminal: %w", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		// A session of its own with the terminal as its controlling tty (fd 0), as
		// creack/pty's Start does: job control and ^C work as in a terminal.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := s.procs.Start(cmd); err != nil {
			master.Close()
			tty.Close()
			return fmt.Errorf("starting the shell: %w", err)
		}
		tty.Close()
		p.tty, p.stdin = master, master
		readers = []*os.File{master}
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return err
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			return err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			outR.Close()
			outW.Close()
			return err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
		closeAfterStart = []*os.File{inR, outW, errW}
		if err := s.procs.Start(cmd); err != nil {
			for _, f := range []*os.File{inR, inW, outR, outW, errR, errW} {
				f.Close()
			}
			return fmt.Errorf("starting the shell: %w", err)
		}
		p.tty, p.stdin = nil, inW
		readers = []*os.File{outR, errR}
	}
	for _, f := range closeAfterStart {
		f.Close()
	}
	p.running, p.isPTY, p.pid = true, usePTY, cmd.Process.Pid
	p.done = make(chan struct{})
	var pumps sync.WaitGroup
	for i, r := range readers {
		ch := PTYStdout
		if i == 1 {
			ch = PTYStderr
		}
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					p.out.write(buf[:n], ch)
				}
				if err != nil {
					return
				}
			}
		}()
	}
	done, stdin := p.done, p.stdin
	go func() {
		err := s.procs.Wait(cmd)
		code := 0
		if err != nil {
			code = exitCodeOf(cmd)
		}
		// Output a leftover child still writes is read for a moment, then the terminal
		// (or the pipes) close so that the pumps end.
		drained := make(chan struct{})
		go func() { pumps.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(ptyDrainWait):
			for _, r := range readers {
				r.Close()
			}
			<-drained
		}
		for _, r := range readers {
			r.Close()
		}
		if stdin != readers[0] {
			stdin.Close()
		}
		p.mu.Lock()
		p.running, p.pid, p.exitCode = false, 0, code
		p.tty, p.stdin = nil, nil
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// exitCodeOf is the shell's exit status, 128+N when signal N ended it (as a shell
// reports it in $?).
func exitCodeOf(cmd *exec.Cmd) int {
	st := cmd.ProcessState
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

func hasEnv(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// writeStdin writes b to the shell's stdin.
func (p *ptySession) writeStdin(b []byte) error {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return errors.New("the shell is not running")
	}
	_, err := w.Write(b)
	return err
}

// ptySignals are the signals a client may send (by name, with or without "SIG").
var ptySignals = map[string]syscall.Signal{
	"SIGINT": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL,
	"SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP, "SIGTSTP": syscall.SIGTSTP,
	"SIGCONT": syscall.SIGCONT, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGWINCH": syscall.SIGWINCH,
}

// signal sends the named signal: in PTY mode to the terminal's foreground process group
// (what ^C reaches: the running command, or the shell at its prompt), in pipe mode to the
// shell's process group. A shell that is not running ignores it.
func (p *ptySession) signal(name string) error {
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	sig, ok := ptySignals[n]
	if !ok {
		return fmt.Errorf("unknown signal %q", name)
	}
	p.mu.Lock()
	pid, tty := p.pid, p.tty
	p.mu.Unlock()
	if pid == 0 {
		return nil
	}
	if pgrp := foregroundGroup(tty); pgrp > 0 && syscall.Kill(-pgrp, sig) == nil {
		return nil
	}
	signalGroup(pid, sig)
	return nil
}

// foregroundGroup is the foreground process group of the terminal whose master is tty
// (TIOCGPGRP), 0 when tty is nil or the call fails. It does not use tty.Fd, which would
// take the master out of the runtime's poller.
func foregroundGroup(tty *os.File) int {
	if tty == nil {
		return 0
	}
	rc, err := tty.SyscallConn()
	if err != nil {
		return 0
	}
	pgrp := 0
	rc.Control(func(fd uintptr) {
		if g, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil {
			pgrp = g
		}
	})
	return pgrp
}

// resize sets the terminal's size (the shell gets SIGWINCH); a no-op in pipe mode.
func (p *ptySession) resize(cols, rows int) error {
	if cols <= 0 || rows <= 0 || cols > 0xffff || rows > 0xffff {
		return fmt.Errorf("cols and rows must be from 1 to 65535, got %dx%d", cols, rows)
	}
	p.mu.Lock()
	tty := p.tty
	p.mu.Unlock()
	if tty == nil {
		return nil
	}
	return setWinsize(tty, cols, rows)
}

// openTerminal opens a pseudo-terminal (creack/pty) and returns its master as a file
// in the runtime's poller, so that closing it ends a read that waits on it (creack/pty
// leaves its master in blocking mode, where a close waits for the read instead), and
// its slave.
func openTerminal() (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		err = unix.SetNonblock(fd, true)
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		tty.Close()
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), m.Name()), tty, nil
}

// setWinsize sets the size of the terminal whose master is f (TIOCSWINSZ), through
// SyscallConn so that f stays in the poller.
func setWinsize(f *os.File, cols, rows int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return ierr
}

// close kills the shell's process group and ends the session: a holder gets the exit
// frame. It is safe to call more than once.
func (p *ptySession) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	pid, tty := p.pid, p.tty
	p.mu.Unlock()
	if pgrp := foregroundGroup(tty); pgrp > 0 && pgrp != pid {
		syscall.Kill(-pgrp, syscall.SIGKILL)
	}
	if pid != 0 {
		signalGroup(pid, syscall.SIGKILL)
	}
	p.out.close()
}

// status is GET /pty/{id}'s answer.
func (p *ptySession) status() PTYStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PTYStatus{SessionID: p.id, Running: p.running, OutputOffset: p.out.Total(),
		LaunchAttempted: p.attempts, LaunchFailed: p.failed}
}

func (s *Server) handleCreatePTY(w http.ResponseWriter, r *http.Request) {
	var req CreatePTYRequest
	if err := decodeJSON(r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	dir := ""
	if req.Cwd != "" {
		var err error
		if dir, err = s.cleanPath(req.Cwd); err != nil {
			writeError(w, err)
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			writeError(w, fmt.Errorf("creating cwd %q: %w", dir, err))
			return
		}
	}
	if s.shell == "" {
		writeError(w, errorf(ErrUnavailable, "this image has no shell for pty sessions"))
		return
	}
	p := &ptySession{id: newID(), dir: dir, command: req.Command, out: newOutputLog(PTYReplayBytes)}
	if err := s.ptys.add(p); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, CreatePTYResponse{SessionID: p.id})
}

func (s *Server) handleGetPTY(w http.ResponseWriter, r *http.Request) {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.status())
}

func (s *Server) handleDeletePTY(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.ptys.mu.Lock()
	p, ok := s.ptys.byID[id]
	delete(s.ptys.byID, id)
	s.ptys.mu.Unlock()
	if !ok {
		writeError(w, errorf(ErrNotFound, "pty session %q not found", id))
		return
	}
	p.close()
	writeEmpty(w)
}
