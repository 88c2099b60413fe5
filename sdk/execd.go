package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// Execd talks to one sandbox's execd (execd-api.yaml, port 44772) through the endpoint
// the lifecycle server gives for it.
type Execd struct {
	c      *Client
	base   string
	header http.Header
}

// Execd returns the execd client of sandbox id (it asks for the endpoint of port
// 44772; no request reaches execd yet).
func (c *Client) Execd(ctx context.Context, id string) (*Execd, error) {
	return c.portClient(ctx, id, opensandbox.ExecdPort)
}

// portClient talks to one port of the sandbox through the endpoint the server gives
// for it, sending the endpoint's headers.
func (c *Client) portClient(ctx context.Context, id string, port int) (*Execd, error) {
	ep, err := c.Endpoint(ctx, id, port)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if strings.HasPrefix(c.base, "https://") {
		scheme = "https"
	}
	h := http.Header{}
	for k, v := range ep.Headers {
		h.Set(k, v)
	}
	return &Execd{c: c, base: ep.URL(scheme), header: h}, nil
}

func (x *Execd) send(ctx context.Context, method, path string, body io.Reader, ctype string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, x.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range x.c.header {
		req.Header[k] = vs
	}
	for k, vs := range x.header {
		req.Header[k] = vs
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if x.c.key != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, x.c.key)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	return x.c.hc.Do(req)
}

func (x *Execd) json(ctx context.Context, method, path string, in, out any) error {
	var rd io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		rd, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := x.send(ctx, method, path, rd, ctype, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeResponse(resp, out)
}

// Ping answers nil when execd is up.
func (x *Execd) Ping(ctx context.Context) error {
	return x.json(ctx, http.MethodGet, "/ping", nil, nil)
}

// WaitReady pings execd every 100 ms until it answers or ctx ends.
func (x *Execd) WaitReady(ctx context.Context) error {
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := x.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sdk: execd not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Event is one event of an execution stream (ServerStreamEvent).
type Event struct {
	Type           string         `json:"type"`
	Text           string         `json:"text,omitempty"`
	ExecutionCount int            `json:"execution_count,omitempty"`
	ExecutionTime  int64          `json:"execution_time,omitempty"`
	Timestamp      int64          `json:"timestamp,omitempty"`
	Results        map[string]any `json:"results,omitempty"`
	Error          *ExecError     `json:"error,omitempty"`
}

// ExecError is a failed execution: for commands Name is "CommandExecError" and Value
// the exit code ("-1" when killed by a signal).
type ExecError struct {
	Name      string   `json:"ename"`
	Value     string   `json:"evalue"`
	Traceback []string `json:"traceback,omitempty"`
}

// Execution is what a finished stream said.
type Execution struct {
	// ID is the command id (from the init event).
	ID      string
	Stdout  []string
	Stderr  []string
	Results []map[string]any
	// Error is set when the execution failed (a command's non-zero exit).
	Error *ExecError
	// Duration is execd's execution_time.
	Duration time.Duration
}

// ExitCode is 0 for success, the command's exit code, or -1 when unknown.
func (e *Execution) ExitCode() int {
	if e.Error == nil {
		return 0
	}
	n, err := strconv.Atoi(e.Error.Value)
	if err != nil {
		return -1
	}
	return n
}

// stream posts body to path and reads the event stream, calling on (may be nil) for
// every event as it arrives.
func (x *Execd) stream(ctx context.Context, path string, body any, on func(Event) error) (*Execution, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	resp, err := x.send(ctx, http.MethodPost, path, bytes.NewReader(b), "application/json", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, apiError(resp)
	}
	ex := &Execution{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var buf strings.Builder
	flush := func() error {
		s := strings.TrimSpace(buf.String())
		buf.Reset()
		if s == "" {
			return nil
		}
		var ev Event
		if err := json.Unmarshal([]byte(s), &ev); err != nil {
			return fmt.Errorf("sdk: bad event %q: %w", s, err)
		}
		switch ev.Type {
		case "init":
			ex.ID = ev.Text
		case "stdout":
			ex.Stdout = append(ex.Stdout, ev.Text)
		case "stderr":
			ex.Stderr = append(ex.Stderr, ev.Text)
		case "result":
			ex.Results = append(ex.Results, ev.Results)
		case "error":
			ex.Error = ev.Error
		case "execution_complete":
			ex.Duration = time.Duration(ev.ExecutionTime) * time.Millisecond
		}
		if on != nil {
			return on(ev)
		}
		return nil
	}
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if err := flush(); err != nil {
				return ex, err
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "data:"); ok {
			line = strings.TrimSpace(rest)
		} else if strings.HasPrefix(line, "event:") || strings.HasPrefix(line, "id:") || strings.HasPrefix(line, ":") {
			continue
		}
		buf.WriteString(line)
	}
	if err := sc.Err(); err != nil {
		return ex, err
	}
	return ex, flush()
}

// Command is a shell command to run (RunCommandRequest).
type Command struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd,omitempty"`
	// Background answers at once; follow with CommandStatus and CommandLogs.
	Background bool `json:"background,omitempty"`
	// TimeoutMS is enforced by execd when positive.
	TimeoutMS int64             `json:"timeout,omitempty"`
	Env       map[string]string `json:"envs,omitempty"`
}

// Run runs a command, calling on for each event as it streams (nil: none), and returns
// the whole execution. A non-zero exit is Execution.Error, not an error.
func (x *Execd) Run(ctx context.Context, cmd Command, on func(Event) error) (*Execution, error) {
	return x.stream(ctx, "/command", cmd, on)
}

// CommandStatus is a command's state (CommandStatusResponse).
type CommandStatus struct {
	ID         string     `json:"id"`
	Content    string     `json:"content"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// CommandStatus returns the status of command id.
func (x *Execd) CommandStatus(ctx context.Context, id string) (*CommandStatus, error) {
	var st CommandStatus
	if err := x.json(ctx, http.MethodGet, "/command/status/"+url.PathEscape(id), nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// CommandLogs returns a background command's combined output from cursor (a byte
// offset; 0 for all) and the cursor to continue from.
func (x *Execd) CommandLogs(ctx context.Context, id string, cursor int64) (string, int64, error) {
	resp, err := x.send(ctx, http.MethodGet, fmt.Sprintf("/command/%s/logs?cursor=%d", url.PathEscape(id), cursor), nil, "", nil)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", 0, apiError(resp)
	}
	b, err := io.ReadAll(resp.Body)
	next, _ := strconv.ParseInt(resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR"), 10, 64)
	return string(b), next, err
}

// Interrupt stops a running command by id.
func (x *Execd) Interrupt(ctx context.Context, id string) error {
	return x.json(ctx, http.MethodDelete, "/command?id="+url.QueryEscape(id), nil, nil)
}

// InterruptCode interrupts the code running in a code context; id is the context id or
// the execution id of a RunCode stream's init event.
func (x *Execd) InterruptCode(ctx context.Context, id string) error {
	return x.json(ctx, http.MethodDelete, "/code?id="+url.QueryEscape(id), nil, nil)
}

// CreateSession starts a bash session whose directory and exported variables persist
// between runs.
func (x *Execd) CreateSession(ctx context.Context, cwd string) (string, error) {
	var out struct {
		ID string `json:"session_id"`
	}
	body := map[string]string{}
	if cwd != "" {
		body["cwd"] = cwd
	}
	err := x.json(ctx, http.MethodPost, "/session", body, &out)
	return out.ID, err
}

// RunInSession runs command in session id, streaming like Run.
func (x *Execd) RunInSession(ctx context.Context, id, command string, on func(Event) error) (*Execution, error) {
	return x.stream(ctx, "/session/"+url.PathEscape(id)+"/run", map[string]string{"command": command}, on)
}

// DeleteSession ends a bash session.
func (x *Execd) DeleteSession(ctx context.Context, id string) error {
	return x.json(ctx, http.MethodDelete, "/session/"+url.PathEscape(id), nil, nil)
}

// FileInfo describes a file in the sandbox.
type FileInfo struct {
	Path       string    `json:"path"`
	Type       string    `json:"type,omitempty"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	// Mode is octal digits written as a decimal number (0644 is 644).
	Mode int `json:"mode"`
}

// WriteFile uploads data to path (parents created). mode is octal digits as decimal
// (644); 0 leaves execd's default.
func (x *Execd) WriteFile(ctx context.Context, path string, data io.Reader, mode int) error {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	meta := map[string]any{"path": path}
	if mode != 0 {
		meta["mode"] = mode
	}
	mb, _ := json.Marshal(meta)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	pw, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	_, _ = pw.Write(mb)
	fw, err := mw.CreateFormFile("file", "file")
	if err != nil {
		return err
	}
	if _, err := io.Copy(fw, data); err != nil {
		return err
	}
	if err := mw.Close(); err != nil {
		return err
	}
	resp, err := x.send(ctx, http.MethodPost, "/files/upload", &buf, mw.FormDataContentType(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeResponse(resp, nil)
}

// ReadFile downloads path whole.
func (x *Execd) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := x.send(ctx, http.MethodGet, "/files/download?path="+url.QueryEscape(path), nil, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, apiError(resp)
	}
	return io.ReadAll(resp.Body)
}

// SearchFiles finds files under dir whose base name matches the glob pattern.
func (x *Execd) SearchFiles(ctx context.Context, dir, pattern string) ([]FileInfo, error) {
	q := url.Values{"path": {dir}}
	if pattern != "" {
		q.Set("pattern", pattern)
	}
	var out []FileInfo
	err := x.json(ctx, http.MethodGet, "/files/search?"+q.Encode(), nil, &out)
	return out, err
}

// DeleteFiles removes files (not directories).
func (x *Execd) DeleteFiles(ctx context.Context, paths ...string) error {
	q := url.Values{"path": paths}
	return x.json(ctx, http.MethodDelete, "/files?"+q.Encode(), nil, nil)
}

// CodeContext is a stateful interpreter: a Jupyter kernel (python, and in the
// code-interpreter image javascript, typescript and go) or a bash shell.
type CodeContext struct {
	ID       string `json:"id,omitempty"`
	Language string `json:"language"`
}

// CreateContext starts an interpreter for language ("python", "bash"; the
// code-interpreter image adds "javascript", "typescript" and "go").
func (x *Execd) CreateContext(ctx context.Context, language string) (*CodeContext, error) {
	var cc CodeContext
	if err := x.json(ctx, http.MethodPost, "/code/context", map[string]string{"language": language}, &cc); err != nil {
		return nil, err
	}
	return &cc, nil
}

// Contexts lists the code contexts, of one language when language is not empty.
func (x *Execd) Contexts(ctx context.Context, language string) ([]CodeContext, error) {
	p := "/code/contexts"
	if language != "" {
		p += "?language=" + url.QueryEscape(language)
	}
	var out []CodeContext
	err := x.json(ctx, http.MethodGet, p, nil, &out)
	return out, err
}

// DeleteContext stops a code context.
func (x *Execd) DeleteContext(ctx context.Context, id string) error {
	return x.json(ctx, http.MethodDelete, "/code/contexts/"+url.PathEscape(id), nil, nil)
}

// RunCode runs code in cc (no ID: the language's default context), streaming like Run.
// Results carry MIME bundles with text/plain renamed "text".
func (x *Execd) RunCode(ctx context.Context, cc CodeContext, code string, on func(Event) error) (*Execution, error) {
	return x.stream(ctx, "/code", map[string]any{"code": code, "context": cc}, on)
}
