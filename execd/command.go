package execd

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// maxFinished is how many finished commands keep their status (and background logs);
// older ones are forgotten first.
const maxFinished = 1024

// interruptGrace is how long an interrupted command has between SIGINT and SIGKILL.
const interruptGrace = 2 * time.Second

// RunCommandRequest is the body of POST /command (RunCommandRequest in execd-api.yaml).
type RunCommandRequest struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd,omitempty"`
	Background bool              `json:"background,omitempty"`
	Timeout    int64             `json:"timeout,omitempty"` // milliseconds, 0: none
	UID        *uint32           `json:"uid,omitempty"`
	GID        *uint32           `json:"gid,omitempty"`
	Envs       map[string]string `json:"envs,omitempty"`
}

// CommandStatus is the answer of GET /command/status/{id}. Times are RFC 3339.
type CommandStatus struct {
	ID         string     `json:"id"`
	Content    string     `json:"content"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// command is one started command, foreground or background.
type command struct {
	id         string
	content    string
	background bool
	logPath    string // background only: combined stdout+stderr
	startedAt  time.Time
	pid        int
	done       chan struct{}

	mu         sync.Mutex
	exitCode   int
	errMsg     string
	finishedAt time.Time
}

func (c *command) status() CommandStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CommandStatus{ID: c.id, Content: c.content, StartedAt: c.startedAt.UTC(), Error: c.errMsg}
	select {
	case <-c.done:
		code := c.exitCode
		fin := c.finishedAt.UTC()
		st.ExitCode, st.FinishedAt = &code, &fin
	default:
		st.Running = true
	}
	return st
}

// finish records how the process ended: the exit code, or -1 with the signal.
func (c *command) finish(state *os.ProcessState, waitErr error) {
	c.mu.Lock()
	c.finishedAt = time.Now()
	c.exitCode, c.errMsg = exitResult(state, waitErr)
	c.mu.Unlock()
	close(c.done)
}

// exitResult turns a finished process into (exit code, error text): code -1 when the
// process was killed by a signal; text "" on success, else like "exit status 2".
func exitResult(state *os.ProcessState, waitErr error) (int, string) {
	if state == nil {
		if waitErr != nil {
			return -1, waitErr.Error()
		}
		return -1, "unknown exit"
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, state.String()
	}
	if state.ExitCode() == 0 {
		return 0, ""
	}
	return state.ExitCode(), state.String()
}

// interrupt sends SIGINT to the command's process group and SIGKILL after a grace time.
func (c *command) interrupt() {
	select {
	case <-c.done:
		return
	default:
	}
	signalGroup(c.pid, syscall.SIGINT)
	go func() {
		select {
		case <-c.done:
		case <-time.After(interruptGrace):
			signalGroup(c.pid, syscall.SIGKILL)
		}
	}()
}

// commands is the registry of started commands.
type commands struct {
	srv  *Server
	mu   sync.Mutex
	byID map[string]*command
	fin  []string // finished ids, oldest first
}

func newCommands(s *Server) *commands { return &commands{srv: s, byID: map[string]*command{}} }

func (cs *commands) add(c *command) {
	cs.mu.Lock()
	cs.byID[c.id] = c
	cs.mu.Unlock()
	go func() {
		<-c.done
		cs.mu.Lock()
		defer cs.mu.Unlock()
		cs.fin = append(cs.fin, c.id)
		for len(cs.fin) > maxFinished {
			old := cs.byID[cs.fin[0]]
			delete(cs.byID, cs.fin[0])
			cs.fin = cs.fin[1:]
			if old != nil && old.logPath != "" {
				os.Remove(old.logPath)
			}
		}
	}()
}

func (cs *commands) get(id string) (*command, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byID[id]
	if !ok {
		return nil, errorf(ErrNotFound, "command %q not found", id)
	}
	return c, nil
}

// close kills every running command.
func (cs *commands) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.byID {
		select {
		case <-c.done:
		default:
			signalGroup(c.pid, syscall.SIGKILL)
		}
	}
}

// shellCommand builds `<shell> -c <line>` in its own process group with the request's
// directory, environment and credentials. Stdin is /dev/null.
func (s *Server) shellCommand(line, cwd string, envs map[string]string, uid, gid *uint32) (*exec.Cmd, error) {
	if s.shell == "" {
		return nil, errorf(ErrUnavailable, "this image has no shell (bash or sh) to run commands")
	}
	cmd := exec.Command(s.shell, "-c", line)
	if err := s.prepareCmd(cmd, cwd, envs, uid, gid); err != nil {
		return nil, err
	}
	return cmd, nil
}

// prepareCmd sets the directory, environment, process group and credentials of cmd.
func (s *Server) prepareCmd(cmd *exec.Cmd, cwd string, envs map[string]string, uid, gid *uint32) error {
	dir := s.cfg.Workdir
	if cwd != "" {
		p, err := s.cleanPath(cwd)
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() {
			return invalidf("cwd %q is not a directory", p)
		}
		dir = p
	}
	cmd.Dir = dir
	cmd.Env = mergeEnv(os.Environ(), envs)
	attr := &syscall.SysProcAttr{Setpgid: true}
	if gid != nil && uid == nil {
		return invalidf("gid needs uid")
	}
	if uid != nil {
		g := *uid
		if gid != nil {
			g = *gid
		} else if pg, ok := primaryGroup(*uid); ok {
			g = pg
		}
		attr.Credential = &syscall.Credential{Uid: *uid, Gid: g, Groups: []uint32{}}
		if _, set := envs["HOME"]; !set {
			if home, ok := homeDir(*uid); ok {
				cmd.Env = mergeEnv(cmd.Env, map[string]string{"HOME": home})
			}
		}
	}
	cmd.SysProcAttr = attr
	return nil
}

// mergeEnv returns base with the entries of over set (replacing same-named ones).
func mergeEnv(base []string, over map[string]string) []string {
	if len(over) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := cutEnv(kv)
		if _, replaced := over[k]; !replaced {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+over[k])
	}
	return out
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

func (s *Server) handleRunCommand(w http.ResponseWriter, r *http.Request) {
	var req RunCommandRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if req.Command == "" {
		writeError(w, invalidf("command is empty"))
		return
	}
	if req.Timeout < 0 {
		writeError(w, invalidf("timeout must not be negative"))
		return
	}
	cmd, err := s.shellCommand(req.Command, req.Cwd, req.Envs, req.UID, req.GID)
	if err != nil {
		writeError(w, err)
		return
	}
	if req.Background {
		s.runBackground(w, cmd, req)
		return
	}
	s.runForeground(w, r, cmd, req)
}

// runBackground starts cmd with its combined output appended to a log file and answers
// init + execution_complete at once.
func (s *Server) runBackground(w http.ResponseWriter, cmd *exec.Cmd, req RunCommandRequest) {
	c := &command{id: newID(), content: req.Command, background: true, done: make(chan struct{})}
	c.logPath = filepath.Join(s.stateDir, "cmd-"+c.id+".log")
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		writeError(w, fmt.Errorf("creating the command log: %w", err))
		return
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	err = s.procs.Start(cmd)
	logf.Close()
	if err != nil {
		os.Remove(c.logPath)
		writeError(w, fmt.Errorf("starting the command: %w", err))
		return
	}
	c.pid, c.startedAt = cmd.Process.Pid, start
	s.cmds.add(c)
	go s.waitCommand(c, cmd, req.Timeout)
	st := newStream(w)
	st.send(Event{Type: EventInit, Text: c.id})
	st.complete(start)
}

// waitCommand waits for cmd, killing its group at the timeout (milliseconds, 0: none).
func (s *Server) waitCommand(c *command, cmd *exec.Cmd, timeoutMs int64) {
	if timeoutMs > 0 {
		t := time.AfterFunc(time.Duration(timeoutMs)*time.Millisecond, func() {
			signalGroup(c.pid, syscall.SIGKILL)
		})
		defer t.Stop()
	}
	err := s.procs.Wait(cmd)
	c.finish(cmd.ProcessState, err)
	s.log.Debug("command finished", "id", c.id, "exit_code", c.status().ExitCode)
}

// runForeground starts cmd and streams its output line by line; the process is killed
// when the client goes away.
func (s *Server) runForeground(w http.ResponseWriter, r *http.Request, cmd *exec.Cmd, req RunCommandRequest) {
	outR, outW, err := os.Pipe()
	if err != nil {
		writeError(w, err)
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		writeError(w, err)
		return
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	start := time.Now()
	err = s.procs.Start(cmd)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		writeError(w, fmt.Errorf("starting the command: %w", err))
		return
	}
	c := &command{id: newID(), content: req.Command, pid: cmd.Process.Pid, startedAt: start, done: make(chan struct{})}
	s.cmds.add(c)
	go s.waitCommand(c, cmd, req.Timeout)

	st := newStream(w)
	st.send(Event{Type: EventInit, Text: c.id})
	readers := pumpLines(st, []io.Reader{outR, errR}, []string{EventStdout, EventStderr})
	select {
	case <-c.done:
	case <-r.Context().Done():
		signalGroup(c.pid, syscall.SIGKILL)
		<-c.done
	}
	drain(readers, outR, errR)
	endStream(st, c, start)
}

// pumpLines sends every line read from readers[i] as an event of kinds[i]; the returned
// channel closes when all readers reached their end.
func pumpLines(st *stream, readers []io.Reader, kinds []string) chan struct{} {
	var wg sync.WaitGroup
	for i, rd := range readers {
		kind := kinds[i]
		wg.Go(func() {
			splitLines(rd, func(line string) { st.send(Event{Type: kind, Text: line}) })
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// drain waits for the output readers after the process ended; if a leftover
// grandchild still holds the pipes open, they are closed after a short grace.
func drain(done chan struct{}, pipes ...*os.File) {
	select {
	case <-done:
	case <-time.After(500 * time.Millisecond):
		for _, p := range pipes {
			p.Close()
		}
		<-done
	}
	for _, p := range pipes {
		p.Close()
	}
}

// endStream sends the last event of a command stream: execution_complete on exit code 0,
// else an error event (CommandExecError, evalue the exit code, -1 for a signal).
func endStream(st *stream, c *command, start time.Time) {
	stat := c.status()
	if stat.ExitCode != nil && *stat.ExitCode == 0 {
		st.complete(start)
		return
	}
	code := -1
	if stat.ExitCode != nil {
		code = *stat.ExitCode
	}
	st.send(Event{Type: EventError, Error: &ErrorDetail{
		Name: "CommandExecError", Value: strconv.Itoa(code), Traceback: []string{stat.Error},
	}})
}

func (s *Server) handleInterruptCommand(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		writeError(w, invalidf("query parameter id is required"))
		return
	}
	c, err := s.cmds.get(id)
	if err != nil {
		// A session run is interruptible by its init id too.
		if s.sessions.interruptRun(id) {
			writeEmpty(w)
			return
		}
		writeError(w, err)
		return
	}
	c.interrupt()
	writeEmpty(w)
}

func (s *Server) handleCommandStatus(w http.ResponseWriter, r *http.Request, id string) {
	c, err := s.cmds.get(id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.status())
}

// handleCommandLogs answers the combined output of a background command from byte
// offset cursor (default 0) to its current end, with the end offset in
// EXECD-COMMANDS-TAIL-CURSOR (NOTES.md). The body is streamed from the log file.
func (s *Server) handleCommandLogs(w http.ResponseWriter, r *http.Request, id string) {
	c, err := s.cmds.get(id)
	if err != nil {
		writeError(w, err)
		return
	}
	if c.logPath == "" {
		writeError(w, invalidf("command %q runs in the foreground: its output is in its stream", c.id))
		return
	}
	var cursor int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		cursor, err = strconv.ParseInt(v, 10, 64)
		if err != nil || cursor < 0 {
			writeError(w, invalidf("cursor %q is not a byte offset", v))
			return
		}
	}
	f, err := os.Open(c.logPath)
	if err != nil {
		writeError(w, fmt.Errorf("opening the command log: %w", err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, err)
		return
	}
	end := fi.Size()
	cursor = min(cursor, end)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("EXECD-COMMANDS-TAIL-CURSOR", strconv.FormatInt(end, 10))
	w.Header().Set("Content-Length", strconv.FormatInt(end-cursor, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, io.NewSectionReader(f, cursor, end-cursor)); err != nil && !errors.Is(err, io.EOF) {
		s.log.Debug("logs write", "id", c.id, "err", err)
	}
}
