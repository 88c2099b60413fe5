package execd

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Event types of a stream (ServerStreamEvent.type in execd-api.yaml).
const (
	EventInit              = "init"
	EventStdout            = "stdout"
	EventStderr            = "stderr"
	EventResult            = "result"
	EventError             = "error"
	EventExecutionCount    = "execution_count"
	EventExecutionComplete = "execution_complete"
	EventPing              = "ping"
)

// Event is one object of a stream: `{"type":"stdout","text":"hi","timestamp":<ms>}`.
// Timestamps are Unix milliseconds.
type Event struct {
	Type           string         `json:"type"`
	Text           string         `json:"text,omitempty"`
	ExecutionCount *int           `json:"execution_count,omitempty"`
	ExecutionTime  *int64         `json:"execution_time,omitempty"`
	Timestamp      int64          `json:"timestamp"`
	Results        map[string]any `json:"results,omitempty"`
	Error          *ErrorDetail   `json:"error,omitempty"`
}

// ErrorDetail is the error of an "error" event. For commands: ename CommandExecError,
// evalue the exit code ("-1" when killed by a signal), traceback ["exit status N"].
type ErrorDetail struct {
	Name      string   `json:"ename"`
	Value     string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// nowMillis is the current time in Unix milliseconds.
func nowMillis() int64 { return time.Now().UnixMilli() }

// stream writes events to an HTTP response: each event is one JSON object followed by a
// blank line (NOTES.md "Streams"), flushed at once. It is safe for concurrent use; writes
// after the client went away are dropped.
type stream struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	broken bool
}

// newStream sends the stream headers and returns the writer.
func newStream(w http.ResponseWriter) *stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, rc: http.NewResponseController(w)}
	s.rc.Flush()
	return s
}

// sendJSON writes any JSON value as one event.
func (s *stream) sendJSON(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return true
	}
	return s.write(append(b, '\n', '\n'))
}

// write writes one framed event and flushes it.
func (s *stream) write(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return false
	}
	if _, err := s.w.Write(b); err != nil {
		s.broken = true
		return false
	}
	if err := s.rc.Flush(); err != nil {
		s.broken = true
		return false
	}
	return true
}

// send writes ev, stamping its timestamp when unset. It reports whether the client is
// still there.
func (s *stream) send(ev Event) bool {
	if ev.Timestamp == 0 {
		ev.Timestamp = nowMillis()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return true
	}
	return s.write(append(b, '\n', '\n'))
}

// complete sends execution_complete with the time since start.
func (s *stream) complete(start time.Time) {
	ms := time.Since(start).Milliseconds()
	s.send(Event{Type: EventExecutionComplete, ExecutionTime: &ms})
}
