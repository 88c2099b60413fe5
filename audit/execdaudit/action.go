package execdaudit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Bounds of what an Action keeps.
const (
	// maxBody is the most of a JSON request body kept for its record: a larger body
	// (code over 256 KiB, say) is recorded without what it said, with
	// extra.body_truncated.
	maxBody = 256 << 10
	// maxResponse is the most of a small JSON response kept (a session's id).
	maxResponse = 4 << 10
	// maxEventLine is the most of one stream event line kept; only init,
	// execution_complete and error lines are kept at all.
	maxEventLine = 16 << 10
)

// Action is one agent action in flight: it observes the request body (through the
// reader Start put in place) and the response (WriteHeader and Write, or Writer), and
// Finish appends its records. The body may be read on another goroutine than the
// response is written on; Action is safe for that.
type Action struct {
	o         *Observer
	op, id    string
	info      Info
	principal string
	start     time.Time
	query     url.Values

	stream, keepResponse bool

	mu          sync.Mutex
	body        []byte
	bodyCut     bool
	bodyBytes   int64
	upload      *uploadParser
	status      int
	resp        []byte
	line        []byte
	lineKeep    bool
	lineStarted bool
	// from the stream's events
	commandID   string
	completed   bool
	execMS      int64
	hasExecMS   bool
	errName     string
	errValue    string
	sawErrEvent bool
	finished    bool
	// process groups of a command (procgroup.go): watch started at the request's
	// arrival (nil: not looked for); remote when it is Info.Groups' (its End(true) runs
	// on a goroutine of its own, groupsDone closed once groups are set).
	watch      GroupWatch
	remote     bool
	groupsDone chan struct{}
	groups     []ProcGroup
	groupsAmbi bool
}

// bodyTee passes the request body through to the proxy and shows it to the Action.
type bodyTee struct {
	rc io.ReadCloser
	a  *Action
}

func (t *bodyTee) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if n > 0 {
		t.a.requestBytes(p[:n])
	}
	return n, err
}

func (t *bodyTee) Close() error { return t.rc.Close() }

// requestBytes observes the next bytes of the request body.
func (a *Action) requestBytes(p []byte) {
	if u := a.upload; u != nil {
		u.write(p) // outside mu: it may wait for the parser
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bodyBytes += int64(len(p))
	if a.bodyCut {
		return
	}
	if len(a.body)+len(p) > maxBody {
		a.bodyCut = true
		a.body = nil
		return
	}
	a.body = append(a.body, p...)
}

// WriteHeader observes the response status (the first one of 200 or above, or 101).
// A nil *Action ignores it.
func (a *Action) WriteHeader(code int) {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		a.status = code
	}
	a.mu.Unlock()
}

// Write observes response body bytes: the events of a stream, the start of a small
// JSON answer. It keeps nothing else and never fails.
func (a *Action) Write(p []byte) {
	if !a.stream && !a.keepResponse {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if a.keepResponse {
		if room := maxResponse - len(a.resp); room > 0 {
			a.resp = append(a.resp, p[:min(room, len(p))]...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if !a.lineStarted && len(chunk) > 0 {
			a.lineStarted = true
			a.lineKeep = true
		}
		if a.lineKeep {
			a.line = append(a.line, chunk[:min(len(chunk), maxEventLine-len(a.line))]...)
			// Decide early whether the line is worth keeping: only a few event types are.
			if len(a.line) >= 32 && !interesting(a.line) {
				a.lineKeep, a.line = false, a.line[:0]
			}
		}
		if i < 0 {
			return
		}
		if a.lineKeep {
			a.event(a.line)
		}
		a.line, a.lineKeep, a.lineStarted = a.line[:0], false, false
		p = p[i+1:]
	}
}

// interesting reports whether an event line (maybe with an SSE "data:" prefix) may be
// an init, execution_complete or error event.
func interesting(line []byte) bool {
	line = bytes.TrimPrefix(bytes.TrimSpace(line), []byte("data:"))
	line = bytes.TrimSpace(line)
	for _, t := range [...]string{`{"type":"init"`, `{"type":"execution_complete"`, `{"type":"error"`} {
		if len(line) >= len(t) && string(line[:len(t)]) == t || len(line) < len(t) && t[:len(line)] == string(line) {
			return true
		}
	}
	return false
}

// event reads one kept event line.
func (a *Action) event(line []byte) {
	line = bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(line), []byte("data:")))
	if !interesting(line) {
		return
	}
	var ev struct {
		Type          string `json:"type"`
		Text          string `json:"text"`
		ExecutionTime *int64 `json:"execution_time"`
		Error         *struct {
			Name  string `json:"ename"`
			Value string `json:"evalue"`
		} `json:"error"`
	}
	if json.Unmarshal(line, &ev) != nil {
		if bytes.HasPrefix(line, []byte(`{"type":"error"`)) { // too long to keep whole
			a.sawErrEvent = true
			a.errName = "unknown"
		}
		return
	}
	switch ev.Type {
	case "init":
		if a.commandID == "" {
			a.commandID = ev.Text
			switch {
			case a.watch != nil && a.remote:
				done, w := make(chan struct{}), a.watch
				a.groupsDone = done
				go func() {
					g, ambi := w.End(true)
					a.mu.Lock()
					a.groups, a.groupsAmbi = g, ambi
					a.mu.Unlock()
					close(done)
				}()
			case a.watch != nil:
				a.groups, a.groupsAmbi = a.watch.End(true)
			}
		}
	case "execution_complete":
		a.completed = true
		if ev.ExecutionTime != nil {
			a.execMS, a.hasExecMS = *ev.ExecutionTime, true
		}
	case "error":
		a.sawErrEvent = true
		if ev.Error != nil {
			a.errName, a.errValue = ev.Error.Name, ev.Error.Value
		}
	}
}

// Writer wraps w so that the response is observed as it is written. It unwraps for
// http.ResponseController (flushes and upgrades reach w).
func (a *Action) Writer(w http.ResponseWriter) http.ResponseWriter {
	return &observedWriter{ResponseWriter: w, a: a}
}

type observedWriter struct {
	http.ResponseWriter
	a *Action
}

func (w *observedWriter) WriteHeader(code int) {
	w.a.WriteHeader(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *observedWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.a.Write(p[:n])
	return n, err
}

// Flush keeps streams flushed event by event for callers that assert http.Flusher.
func (w *observedWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *observedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Finish appends the action's records (one per file or path for file operations, at
// most maxItems). status is the status the client got when the proxy answered itself
// (502 when the sandbox did not answer, say), 0 to use what was observed. Only the
// first call records.
func (a *Action) Finish(status int) {
	if a == nil {
		return
	}
	if a.upload != nil {
		a.upload.close()
	}
	a.mu.Lock()
	if a.finished {
		a.mu.Unlock()
		return
	}
	a.finished = true
	done := a.groupsDone
	if a.watch != nil && done == nil {
		a.watch.End(false)
	}
	if status != 0 {
		a.status = status
	}
	a.mu.Unlock()
	now := time.Now()
	if done != nil {
		select {
		case <-done:
		default: // the remote source has not answered: the record follows it
			go func() {
				<-done
				a.appendRecords(now)
			}()
			return
		}
	}
	a.appendRecords(now)
}

// appendRecords appends the action's records as of now.
func (a *Action) appendRecords(now time.Time) {
	for _, rec := range a.records(now) {
		a.o.sink.Append(rec)
	}
}

// exitCode is the exit code of a command's stream: 0 once complete, the error's
// evalue for CommandExecError (-1 when a signal ended it).
func (a *Action) exitCode() (int, bool) {
	if a.completed && !a.sawErrEvent {
		return 0, true
	}
	if a.errName == "CommandExecError" {
		if n, err := strconv.Atoi(a.errValue); err == nil {
			return n, true
		}
	}
	return 0, false
}
