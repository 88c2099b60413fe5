package execd

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// CreateSessionRequest is the optional body of POST /session.
type CreateSessionRequest struct {
	Cwd string `json:"cwd,omitempty"`
}

// CreateSessionResponse is the answer of POST /session.
type CreateSessionResponse struct {
	SessionID string `json:"session_id"`
}

// RunInSessionRequest is the body of POST /session/{id}/run. Timeout is in milliseconds.
type RunInSessionRequest struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd,omitempty"`
	Timeout int64  `json:"timeout,omitempty"`
}

// sessions is the registry of bash sessions and of their running runs.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*shell
	runs map[string]*shell // run id -> shell, while the run is active
}

func newSessions(*Server) *sessions {
	return &sessions{byID: map[string]*shell{}, runs: map[string]*shell{}}
}

func (ss *sessions) get(id string) (*shell, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sh, ok := ss.byID[id]
	if !ok {
		return nil, errorf(ErrNotFound, "session %q not found", id)
	}
	return sh, nil
}

// interruptRun interrupts the session run with this init id; false when none runs.
func (ss *sessions) interruptRun(runID string) bool {
	ss.mu.Lock()
	sh, ok := ss.runs[runID]
	ss.mu.Unlock()
	if ok {
		sh.interrupt()
	}
	return ok
}

func (ss *sessions) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, sh := range ss.byID {
		sh.close()
		delete(ss.byID, id)
	}
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var req CreateSessionRequest
	if err := decodeJSON(r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	sh, err := s.startShell(req.Cwd)
	if err != nil {
		writeError(w, err)
		return
	}
	id := newID()
	s.sessions.mu.Lock()
	s.sessions.byID[id] = sh
	s.sessions.mu.Unlock()
	writeJSON(w, http.StatusOK, CreateSessionResponse{SessionID: id})
}

// handleRunInSession runs a command in the session's shell and streams its output
// (stderr arrives as stdout events, NOTES.md). A per-run cwd becomes the session's
// directory.
func (s *Server) handleRunInSession(w http.ResponseWriter, r *http.Request) {
	sh, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req RunInSessionRequest
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
	dir := ""
	if req.Cwd != "" {
		if dir, err = s.cleanPath(req.Cwd); err != nil {
			writeError(w, err)
			return
		}
	}
	if !sh.mu.TryLock() {
		writeError(w, errorf(ErrBusy, "session %q is running another command", r.PathValue("id")))
		return
	}
	sh.mu.Unlock()
	runID := newID()
	s.sessions.mu.Lock()
	s.sessions.runs[runID] = sh
	s.sessions.mu.Unlock()
	defer func() {
		s.sessions.mu.Lock()
		delete(s.sessions.runs, runID)
		s.sessions.mu.Unlock()
	}()

	start := time.Now()
	st := newStream(w)
	st.send(Event{Type: EventInit, Text: runID})
	code, err := sh.run(r.Context(), req.Command, dir, time.Duration(req.Timeout)*time.Millisecond,
		func(line string) { st.send(Event{Type: EventStdout, Text: line}) })
	sendExit(st, start, code, err)
	if errors.Is(err, errShellExited) {
		s.sessions.mu.Lock()
		delete(s.sessions.byID, r.PathValue("id"))
		s.sessions.mu.Unlock()
		sh.close()
	}
}

// sendExit ends a shell-run stream: execution_complete for status 0, else an error event.
func sendExit(st *stream, start time.Time, code int, err error) {
	switch {
	case err != nil:
		st.send(Event{Type: EventError, Error: &ErrorDetail{Name: "CommandExecError", Value: strconv.Itoa(code), Traceback: []string{err.Error()}}})
	case code == 0:
		st.complete(start)
	default:
		st.send(Event{Type: EventError, Error: &ErrorDetail{Name: "CommandExecError", Value: strconv.Itoa(code), Traceback: []string{"exit status " + strconv.Itoa(code)}}})
	}
}

func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.sessions.mu.Lock()
	sh, ok := s.sessions.byID[id]
	delete(s.sessions.byID, id)
	s.sessions.mu.Unlock()
	if !ok {
		writeError(w, errorf(ErrNotFound, "session %q not found", id))
		return
	}
	sh.close()
	writeEmpty(w)
}
