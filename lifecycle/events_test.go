package lifecycle

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestEventRingBounded(t *testing.T) {
	rec := &record{}
	long := strings.Repeat("x", 1000)
	for i := range eventRingLen + 10 {
		addEventLocked(rec, EventLifecycle, EventNormal, "Test", long+string(rune('a'+i%26)))
	}
	if len(rec.Events) != eventRingLen {
		t.Fatalf("ring holds %d events, want %d", len(rec.Events), eventRingLen)
	}
	for _, e := range rec.Events {
		if len(e.Message) > eventMessageMax {
			t.Fatalf("message of %d bytes kept", len(e.Message))
		}
	}
	e := Event{Time: time.Date(2026, 3, 25, 10, 1, 13, 0, time.UTC), Source: EventRuntime, Type: EventWarning, Reason: "Exited", Message: "exit code 3\nmore"}
	if got, want := e.line(), "2026-03-25T10:01:13Z runtime Warning Exited exit code 3 more"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}

func TestLinesUntilAndTail(t *testing.T) {
	text := []byte("2026-03-25T10:00:00.5Z one\n2026-03-25T10:00:01Z two\nno timestamp\n2026-03-25T10:00:03Z three\n")
	got := string(linesUntil(text, time.Date(2026, 3, 25, 10, 0, 1, 0, time.UTC)))
	if want := "2026-03-25T10:00:00.5Z one\n2026-03-25T10:00:01Z two\nno timestamp\n"; got != want {
		t.Errorf("linesUntil %q, want %q", got, want)
	}
	if got := string(keepTail([]byte("aaaa\nbbbb\ncccc\n"), 8)); got != "cccc\n" {
		t.Errorf("keepTail %q", got)
	}
	tb := &TailBuffer{Max: 10}
	for range 100 {
		_, _ = tb.Write([]byte("line-xyz\n"))
	}
	b, dropped := tb.Bytes()
	if string(b) != "line-xyz\n" || !dropped || tb.Lines() != 100 {
		t.Errorf("TailBuffer %q dropped %v lines %d", b, dropped, tb.Lines())
	}
	small := &TailBuffer{Max: 100}
	_, _ = small.Write([]byte("a\nb\n"))
	if b, dropped := small.Bytes(); string(b) != "a\nb\n" || dropped {
		t.Errorf("TailBuffer under its limit: %q %v", b, dropped)
	}
}

func TestIsDiagnosticDownload(t *testing.T) {
	for path, want := range map[string]bool{
		"/sandboxes/abc/diagnostics/logs/download":         true,
		"/sandboxes/abc/diagnostics/events/download":       true,
		"/sandboxes/abc/diagnostics/logs":                  false,
		"/sandboxes/abc/diagnostics/other/download":        false,
		"/sandboxes//diagnostics/logs/download":            false,
		"/sandboxes/abc/proxy/1/diagnostics/logs/download": false,
	} {
		if got := isDiagnosticDownload(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	if isDiagnosticDownload(httptest.NewRequest("POST", "/sandboxes/abc/diagnostics/logs/download", nil)) {
		t.Error("a POST is not a download")
	}
}
