package execd_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	execdtest.Cleanup()
	os.Exit(code)
}

// httpc talks to execd in tests; streams may run long, so no overall timeout.
var httpc = &http.Client{}

func do(t testing.TB, method, url string, body any, hdr ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

// expect reads the body and fails unless the status is want; it returns the body.
func expect(t testing.TB, resp *http.Response, want int) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d; body %s", resp.Request.Method, resp.Request.URL, resp.StatusCode, want, b)
	}
	return b
}

// expectError checks a JSON {code, message} error answer.
func expectError(t testing.TB, resp *http.Response, status int, code string) {
	t.Helper()
	b := expect(t, resp, status)
	var e struct{ Code, Message string }
	if err := json.Unmarshal(b, &e); err != nil || e.Code != code || e.Message == "" {
		t.Fatalf("error body %s: want code %s with a message", b, code)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q", ct)
	}
}

// decodeInto reads a JSON 200 answer into v.
func decodeInto(t testing.TB, resp *http.Response, v any) {
	t.Helper()
	b := expect(t, resp, http.StatusOK)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// eventStream parses a stream the way the SDK does: JSON objects separated by blank
// lines. It checks the framing: every event is followed by an empty line.
type eventStream struct {
	t    testing.TB
	resp *http.Response
	sc   *bufio.Scanner
}

func openStream(t testing.TB, resp *http.Response) *eventStream {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream %s: status %d: %s", resp.Request.URL, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &eventStream{t: t, resp: resp, sc: sc}
}

// next returns the next event, false at the end of the stream.
func (s *eventStream) next() (execd.Event, bool) {
	s.t.Helper()
	if !s.sc.Scan() {
		s.resp.Body.Close()
		return execd.Event{}, false
	}
	var ev execd.Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		s.t.Fatalf("stream line %q is not a JSON event: %v", s.sc.Text(), err)
	}
	if ev.Timestamp < time.Now().Add(-time.Hour).UnixMilli() {
		s.t.Fatalf("event %+v has no millisecond timestamp", ev)
	}
	if !s.sc.Scan() || s.sc.Text() != "" {
		s.t.Fatalf("event %q is not followed by a blank line", s.sc.Text())
	}
	return ev, true
}

func (s *eventStream) all() []execd.Event {
	var out []execd.Event
	for {
		ev, ok := s.next()
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

// run posts body to a stream endpoint and returns all events.
func run(t testing.TB, url string, body any) []execd.Event {
	t.Helper()
	return openStream(t, do(t, http.MethodPost, url, body)).all()
}

// texts returns the texts of the events of one type.
func texts(evs []execd.Event, typ string) []string {
	var out []string
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e.Text)
		}
	}
	return out
}

// checkFrame asserts init first with an id, and the given last event type.
func checkFrame(t testing.TB, evs []execd.Event, last string) {
	t.Helper()
	if len(evs) < 2 || evs[0].Type != execd.EventInit || evs[0].Text == "" {
		t.Fatalf("stream does not start with init carrying an id: %+v", evs)
	}
	if got := evs[len(evs)-1].Type; got != last {
		t.Fatalf("last event %q, want %q: %+v", got, last, evs)
	}
	for _, e := range evs[1 : len(evs)-1] {
		if e.Type == execd.EventInit || e.Type == execd.EventExecutionComplete {
			t.Fatalf("%s in the middle of the stream: %+v", e.Type, evs)
		}
	}
	if last == execd.EventError {
		for _, e := range evs {
			if e.Type == execd.EventExecutionComplete {
				t.Fatalf("error stream also holds execution_complete: %+v", evs)
			}
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
