package execd

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlockdev/airlock/execd/jupyter"
)

// CodeContext is a stateful interpreter (CodeContext in execd-api.yaml).
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
}

// RunCodeRequest is the body of POST /code. Without context.id the code runs in the
// language's default context (python when no language is given).
type RunCodeRequest struct {
	Code    string       `json:"code"`
	Context *CodeContext `json:"context,omitempty"`
}

// codeContext is one interpreter: a Jupyter kernel, or a bash shell for "bash".
type codeContext struct {
	CodeContext
	kernel *jupyter.Kernel
	shell  *shell
}

func (c *codeContext) interrupt() error {
	if c.kernel != nil {
		return c.kernel.Interrupt()
	}
	c.shell.interrupt()
	return nil
}

func (c *codeContext) close() {
	if c.kernel != nil {
		c.kernel.Close()
	} else {
		c.shell.close()
	}
}

// codeContexts is the registry of code contexts and of running executions.
type codeContexts struct {
	srv      *Server
	mu       sync.Mutex
	byID     map[string]*codeContext
	defaults map[string]string       // language -> default context id
	execs    map[string]*codeContext // running execution id -> context
	create   sync.Mutex              // serializes default-context creation
}

func newCodeContexts(s *Server) *codeContexts {
	return &codeContexts{srv: s, byID: map[string]*codeContext{}, defaults: map[string]string{}, execs: map[string]*codeContext{}}
}

// defaultKernelDirs are Jupyter's standard kernelspec locations ($JUPYTER_PATH first).
func defaultKernelDirs() []string {
	var dirs []string
	for _, p := range filepath.SplitList(os.Getenv("JUPYTER_PATH")) {
		if p != "" {
			dirs = append(dirs, filepath.Join(p, "kernels"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".local/share/jupyter/kernels"))
	}
	return append(dirs, "/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels",
		"/opt/conda/share/jupyter/kernels")
}

// normLanguage maps a requested language to the name contexts are filed under.
func normLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "", "python3", "py":
		return "python"
	case "sh", "shell":
		return "bash"
	case "js", "node", "nodejs":
		return "javascript"
	case "ts":
		return "typescript"
	case "golang":
		return "go"
	}
	return l
}

// findSpec returns the kernelspec for language: one whose language or name matches.
// For python an image with python3 but no kernelspec gets the ipykernel launcher.
func (cc *codeContexts) findSpec(language string) (jupyter.Spec, error) {
	specs := jupyter.FindSpecs(cc.srv.cfg.KernelDirs)
	for _, s := range specs {
		if normLanguage(s.Language) == language || normLanguage(s.Name) == language {
			return s, nil
		}
	}
	if language == "python" {
		if py, err := exec.LookPath("python3"); err == nil {
			return jupyter.Spec{Name: "python3", Language: "python",
				Argv: []string{py, "-m", "ipykernel_launcher", "-f", "{connection_file}"}}, nil
		}
	}
	have := []string{}
	if strings.HasSuffix(cc.srv.shell, "bash") {
		have = append(have, "bash")
	}
	for _, s := range specs {
		have = append(have, normLanguage(s.Language))
	}
	return jupyter.Spec{}, errorf(ErrUnsupportedLanguage,
		"language %q is not available in this sandbox: no Jupyter kernelspec for it in %s (available: %s)",
		language, strings.Join(cc.srv.cfg.KernelDirs, ", "), strings.Join(have, ", "))
}

// start creates a context for language (already normalized).
func (cc *codeContexts) start(ctx context.Context, language string) (*codeContext, error) {
	c := &codeContext{CodeContext: CodeContext{ID: newID(), Language: language}}
	if language == "bash" {
		sh, err := cc.srv.startShell("")
		if err != nil {
			return nil, errorf(ErrUnsupportedLanguage, "language \"bash\" is not available: %v", err)
		}
		c.shell = sh
	} else {
		spec, err := cc.findSpec(language)
		if err != nil {
			return nil, err
		}
		k, err := jupyter.Start(ctx, jupyter.Config{
			Spec: spec, Dir: cc.srv.cfg.Workdir, StateDir: cc.srv.stateDir,
			Start: cc.srv.procs.Start, Wait: cc.srv.procs.Wait, Logger: cc.srv.log,
		})
		if err != nil {
			return nil, errorf(ErrUnavailable, "starting the %s kernel %q failed: %v", language, spec.Name, err)
		}
		c.kernel = k
	}
	cc.mu.Lock()
	cc.byID[c.ID] = c
	cc.mu.Unlock()
	cc.srv.log.Info("code context started", "id", c.ID, "language", language)
	return c, nil
}

func (cc *codeContexts) get(id string) (*codeContext, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	c, ok := cc.byID[id]
	if !ok {
		return nil, errorf(ErrNotFound, "code context %q not found", id)
	}
	return c, nil
}

// defaultFor returns the language's default context, starting it on first use.
func (cc *codeContexts) defaultFor(ctx context.Context, language string) (*codeContext, error) {
	cc.create.Lock()
	defer cc.create.Unlock()
	cc.mu.Lock()
	c, ok := cc.byID[cc.defaults[language]]
	cc.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := cc.start(ctx, language)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	cc.defaults[language] = c.ID
	cc.mu.Unlock()
	return c, nil
}

// remove forgets and closes a context; false when unknown.
func (cc *codeContexts) remove(id string) bool {
	cc.mu.Lock()
	c, ok := cc.byID[id]
	delete(cc.byID, id)
	cc.mu.Unlock()
	if ok {
		c.close()
	}
	return ok
}

func (cc *codeContexts) list(language string) []CodeContext {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	out := []CodeContext{}
	for _, c := range cc.byID {
		if language == "" || c.Language == language {
			out = append(out, c.CodeContext)
		}
	}
	slices.SortFunc(out, func(a, b CodeContext) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (cc *codeContexts) close() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for id, c := range cc.byID {
		c.close()
		delete(cc.byID, id)
	}
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) {
	var req CodeContext
	if err := decodeJSON(r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	c, err := s.code.start(r.Context(), normLanguage(req.Language))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.CodeContext)
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request) {
	lang := r.URL.Query().Get("language")
	if lang != "" {
		lang = normLanguage(lang)
	}
	writeJSON(w, http.StatusOK, s.code.list(lang))
}

func (s *Server) handleDeleteContexts(w http.ResponseWriter, r *http.Request) {
	lang := r.URL.Query().Get("language")
	if lang == "" {
		writeError(w, invalidf("query parameter language is required"))
		return
	}
	for _, c := range s.code.list(normLanguage(lang)) {
		s.code.remove(c.ID)
	}
	writeEmpty(w)
}

func (s *Server) handleGetContext(w http.ResponseWriter, r *http.Request) {
	c, err := s.code.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.CodeContext)
}

func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request) {
	if !s.code.remove(r.PathValue("id")) {
		writeError(w, errorf(ErrNotFound, "code context %q not found", r.PathValue("id")))
		return
	}
	writeEmpty(w)
}

// handleInterruptCode interrupts the code running in a context; id is the context id or
// the execution id of a running stream's init event.
func (s *Server) handleInterruptCode(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		writeError(w, invalidf("query parameter id is required"))
		return
	}
	s.code.mu.Lock()
	c, ok := s.code.byID[id]
	if !ok {
		c, ok = s.code.execs[id]
	}
	s.code.mu.Unlock()
	if !ok {
		writeError(w, errorf(ErrNotFound, "code context or execution %q not found", id))
		return
	}
	if err := c.interrupt(); err != nil {
		writeError(w, err)
		return
	}
	writeEmpty(w)
}

func (s *Server) handleRunCode(w http.ResponseWriter, r *http.Request) {
	var req RunCodeRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	var (
		c   *codeContext
		err error
	)
	switch {
	case req.Context != nil && req.Context.ID != "":
		c, err = s.code.get(req.Context.ID)
	case req.Context != nil:
		c, err = s.code.defaultFor(r.Context(), normLanguage(req.Context.Language))
	default:
		c, err = s.code.defaultFor(r.Context(), "python")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if c.shell != nil {
		if !c.shell.mu.TryLock() {
			writeError(w, errorf(ErrBusy, "code context %q is running other code", c.ID))
			return
		}
		c.shell.mu.Unlock()
	}
	execID := newID()
	s.code.mu.Lock()
	s.code.execs[execID] = c
	s.code.mu.Unlock()
	defer func() {
		s.code.mu.Lock()
		delete(s.code.execs, execID)
		s.code.mu.Unlock()
	}()

	start := time.Now()
	st := newStream(w)
	st.send(Event{Type: EventInit, Text: execID})
	if c.shell != nil {
		code, err := c.shell.run(r.Context(), req.Code, "", 0, func(line string) {
			st.send(Event{Type: EventStdout, Text: line})
		})
		sendExit(st, start, code, err)
		if errors.Is(err, errShellExited) {
			s.code.remove(c.ID)
		}
		return
	}
	var (
		failed bool
		status string
		stderr strings.Builder
	)
	for attempt := 0; ; attempt++ {
		status, err = c.kernel.Execute(r.Context(), req.Code, func(m jupyter.Message) {
			if ev, ok := kernelEvent(m); ok {
				failed = failed || ev.Type == EventError
				if ev.Type == EventStderr && stderr.Len() < 64<<10 {
					stderr.WriteString(ev.Text)
				}
				st.send(ev)
			}
		})
		// A kernel may abort a request that arrives just after a failed one (tslab
		// aborts everything for 200 ms after an error, as if it had been queued behind
		// it). execd sends one request at a time, so nothing was queued: run it again.
		if err != nil || (status != "aborted" && status != "abort") || attempt == 2 || r.Context().Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	switch {
	case err != nil:
		st.send(Event{Type: EventError, Error: &ErrorDetail{Name: "KernelError", Value: err.Error(), Traceback: []string{err.Error()}}})
		if errors.Is(err, jupyter.ErrDead) {
			s.code.remove(c.ID)
		}
	case !failed && status == "error":
		// Some kernels (tslab) print the error to stderr and publish no error message;
		// the reply's status still says the cell failed.
		st.send(Event{Type: EventError, Error: stderrError(stderr.String())})
	case !failed:
		st.complete(start)
	}
}

// errorLine is a JavaScript-style "Name: message" line (TypeError: x is not a function).
var errorLine = regexp.MustCompile(`^((?:[A-Za-z_$][A-Za-z0-9_$]*)?(?:Error|Exception)): ?(.*)$`)

// stderrError makes an error event from what a failed cell wrote to stderr: the first
// "SomethingError: message" line names it, else it is an Error whose value is the first
// non-empty line; the traceback is the stderr lines.
func stderrError(text string) *ErrorDetail {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	e := &ErrorDetail{Name: "Error", Traceback: []string{}}
	if text == "" {
		e.Value = "the cell failed"
		return e
	}
	e.Traceback = lines
	for _, l := range lines {
		if m := errorLine.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			e.Name, e.Value = m[1], m[2]
			return e
		}
	}
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			e.Value = strings.TrimSpace(l)
			break
		}
	}
	return e
}

// kernelEvent turns an iopub message into a stream event: stream → stdout/stderr,
// execute_input → execution_count, execute_result and display_data → result (the
// text/plain entry renamed text), error → error. Other messages give no event.
func kernelEvent(m jupyter.Message) (Event, bool) {
	var c struct {
		Name           string         `json:"name"`
		Text           string         `json:"text"`
		ExecutionCount *int           `json:"execution_count"`
		Data           map[string]any `json:"data"`
		EName          string         `json:"ename"`
		EValue         string         `json:"evalue"`
		Traceback      []string       `json:"traceback"`
	}
	if err := json.Unmarshal(m.Content, &c); err != nil {
		return Event{}, false
	}
	switch m.Header.MsgType {
	case "stream":
		kind := EventStdout
		if c.Name == "stderr" {
			kind = EventStderr
		}
		return Event{Type: kind, Text: c.Text}, true
	case "execute_input":
		if c.ExecutionCount == nil {
			return Event{}, false
		}
		return Event{Type: EventExecutionCount, ExecutionCount: c.ExecutionCount}, true
	case "execute_result", "display_data":
		if v, ok := c.Data["text/plain"]; ok {
			delete(c.Data, "text/plain")
			c.Data["text"] = v
		}
		return Event{Type: EventResult, Results: c.Data, ExecutionCount: c.ExecutionCount}, true
	case "error":
		if c.Traceback == nil {
			c.Traceback = []string{}
		}
		return Event{Type: EventError, Error: &ErrorDetail{Name: c.EName, Value: c.EValue, Traceback: c.Traceback}}, true
	}
	return Event{}, false
}
