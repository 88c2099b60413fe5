package execd_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/opensandbox"
)

func TestCommandsInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	url := sb.URL + "/command"

	t.Run("stdout_stderr_lines_and_complete", func(t *testing.T) {
		evs := run(t, url, execd.RunCommandRequest{Command: "echo hi; echo err >&2; printf 'a\\nb\\r\\nc'"})
		checkFrame(t, evs, execd.EventExecutionComplete)
		if got := texts(evs, execd.EventStdout); !equal(got, []string{"hi", "a", "b", "c"}) {
			t.Fatalf("stdout events %q", got)
		}
		if got := texts(evs, execd.EventStderr); !equal(got, []string{"err"}) {
			t.Fatalf("stderr events %q", got)
		}
		if evs[len(evs)-1].ExecutionTime == nil {
			t.Fatal("execution_complete without execution_time")
		}
	})

	t.Run("exit_code_is_an_error_event", func(t *testing.T) {
		evs := run(t, url, execd.RunCommandRequest{Command: "echo before; exit 3"})
		checkFrame(t, evs, execd.EventError)
		e := evs[len(evs)-1].Error
		if e == nil || e.Name != "CommandExecError" || e.Value != "3" || len(e.Traceback) != 1 || e.Traceback[0] != "exit status 3" {
			t.Fatalf("error event %+v", e)
		}
	})

	t.Run("env_cwd_uid", func(t *testing.T) {
		uid := uint32(65534)
		evs := run(t, url, execd.RunCommandRequest{Command: "echo $FOO; pwd; id -u; id -g", Cwd: "/tmp",
			Envs: map[string]string{"FOO": "bar baz"}, UID: &uid})
		checkFrame(t, evs, execd.EventExecutionComplete)
		if got := texts(evs, execd.EventStdout); !equal(got, []string{"bar baz", "/tmp", "65534", "65534"}) {
			t.Fatalf("stdout %q", got)
		}
	})

	t.Run("large_output_streams_every_line", func(t *testing.T) {
		evs := run(t, url, execd.RunCommandRequest{Command: "seq 1 50000"})
		checkFrame(t, evs, execd.EventExecutionComplete)
		out := texts(evs, execd.EventStdout)
		if len(out) != 50000 || out[0] != "1" || out[49999] != "50000" {
			t.Fatalf("%d stdout events, first %q", len(out), out[:min(3, len(out))])
		}
	})

	t.Run("interrupt_ends_sleep", func(t *testing.T) {
		st := openStream(t, do(t, http.MethodPost, url, execd.RunCommandRequest{Command: "sleep 30"}))
		init, ok := st.next()
		if !ok || init.Type != execd.EventInit {
			t.Fatalf("first event %+v", init)
		}
		start := time.Now()
		expect(t, do(t, http.MethodDelete, url+"?id="+init.Text, nil), http.StatusOK)
		rest := st.all()
		if len(rest) == 0 || rest[len(rest)-1].Type != execd.EventError || rest[len(rest)-1].Error.Value != "-1" {
			t.Fatalf("after interrupt: %+v", rest)
		}
		if time.Since(start) > 25*time.Second {
			t.Fatalf("the interrupted stream ran on for %s", time.Since(start))
		}
		var stat execd.CommandStatus
		decodeInto(t, do(t, http.MethodGet, sb.URL+"/command/status/"+init.Text, nil), &stat)
		if stat.Running || stat.ExitCode == nil || *stat.ExitCode != -1 || stat.FinishedAt == nil {
			t.Fatalf("status after interrupt %+v", stat)
		}
	})

	t.Run("timeout_kills", func(t *testing.T) {
		evs := run(t, url, execd.RunCommandRequest{Command: "sleep 30", Timeout: 300})
		checkFrame(t, evs, execd.EventError)
		if v := evs[len(evs)-1].Error.Value; v != "-1" {
			t.Fatalf("evalue %q", v)
		}
	})

	t.Run("background_status_and_logs_by_cursor", func(t *testing.T) {
		evs := run(t, url, execd.RunCommandRequest{Background: true,
			Command: "for i in 1 2 3; do echo line$i; sleep 0.1; done; echo oops >&2; exit 4"})
		if len(evs) != 2 || evs[0].Type != execd.EventInit || evs[1].Type != execd.EventExecutionComplete {
			t.Fatalf("background stream %+v", evs)
		}
		id := evs[0].Text
		var stat execd.CommandStatus
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			decodeInto(t, do(t, http.MethodGet, sb.URL+"/command/status/"+id, nil), &stat)
			if !stat.Running || time.Now().After(deadline) {
				break
			}
		}
		if stat.Running || stat.ExitCode == nil || *stat.ExitCode != 4 || !strings.Contains(stat.Content, "line$i") {
			t.Fatalf("status %+v", stat)
		}
		full := "line1\nline2\nline3\noops\n"
		logs := func(cursor string) (string, string) {
			u := sb.URL + "/command/" + id + "/logs"
			if cursor != "" {
				u += "?cursor=" + cursor
			}
			resp := do(t, http.MethodGet, u, nil)
			body := expect(t, resp, http.StatusOK)
			return string(body), resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR")
		}
		if body, cur := logs(""); body != full || cur != strconv.Itoa(len(full)) {
			t.Fatalf("full logs %q cursor %q", body, cur)
		}
		if body, cur := logs("6"); body != full[6:] || cur != strconv.Itoa(len(full)) {
			t.Fatalf("logs from 6: %q cursor %q", body, cur)
		}
		if body, cur := logs(strconv.Itoa(len(full))); body != "" || cur != strconv.Itoa(len(full)) {
			t.Fatalf("logs at the end: %q cursor %q", body, cur)
		}
		expectError(t, do(t, http.MethodGet, sb.URL+"/command/"+id+"/logs?cursor=-1", nil), http.StatusBadRequest, "INVALID_REQUEST")
	})

	t.Run("bad_requests", func(t *testing.T) {
		expectError(t, do(t, http.MethodPost, url, `{"command":`), http.StatusBadRequest, "INVALID_REQUEST")
		expectError(t, do(t, http.MethodPost, url, execd.RunCommandRequest{}), http.StatusBadRequest, "INVALID_REQUEST")
		expectError(t, do(t, http.MethodPost, url, execd.RunCommandRequest{Command: "true", Cwd: "/nonexistent"}), http.StatusBadRequest, "INVALID_REQUEST")
		expectError(t, do(t, http.MethodDelete, url+"?id=unknown", nil), http.StatusNotFound, "NOT_FOUND")
		expectError(t, do(t, http.MethodGet, sb.URL+"/command/status/unknown", nil), http.StatusNotFound, "NOT_FOUND")
		expectError(t, do(t, http.MethodGet, sb.URL+"/nothing/here", nil), http.StatusNotFound, "NOT_FOUND")
	})
}

func TestSessionsInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	var created execd.CreateSessionResponse
	decodeInto(t, do(t, http.MethodPost, sb.URL+"/session", map[string]string{"cwd": "/workspace"}), &created)
	runURL := sb.URL + "/session/" + created.SessionID + "/run"

	evs := run(t, runURL, execd.RunInSessionRequest{Command: "cd /tmp && export GREETING=hello; counter=7; f() { echo fn$1; }; echo to-stderr >&2"})
	checkFrame(t, evs, execd.EventExecutionComplete)
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"to-stderr"}) {
		t.Fatalf("stderr should come back as stdout: %+v", evs)
	}
	evs = run(t, runURL, execd.RunInSessionRequest{Command: "pwd; echo $GREETING $counter; f 1"})
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"/tmp", "hello 7", "fn1"}) {
		t.Fatalf("state did not persist: %q", got)
	}
	evs = run(t, runURL, execd.RunInSessionRequest{Command: "pwd", Cwd: "/etc"})
	evs = append(evs, run(t, runURL, execd.RunInSessionRequest{Command: "pwd; exit_code_test() { return 5; }; exit_code_test"})...)
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"/etc", "/etc"}) {
		t.Fatalf("per-run cwd did not become the session's: %q", got)
	}
	if last := evs[len(evs)-1]; last.Type != execd.EventError || last.Error.Value != "5" {
		t.Fatalf("exit status 5 not reported: %+v", last)
	}
	evs = run(t, runURL, execd.RunInSessionRequest{Command: `echo "unclosed`})
	checkFrame(t, evs, execd.EventError)
	evs = run(t, runURL, execd.RunInSessionRequest{Command: "sleep 30", Timeout: 300})
	checkFrame(t, evs, execd.EventError)
	evs = run(t, runURL, execd.RunInSessionRequest{Command: "echo $GREETING"})
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"hello"}) {
		t.Fatalf("session lost its state after a syntax error and a timeout: %q", got)
	}

	expect(t, do(t, http.MethodDelete, sb.URL+"/session/"+created.SessionID, nil), http.StatusOK)
	expectError(t, do(t, http.MethodPost, runURL, execd.RunInSessionRequest{Command: "true"}), http.StatusNotFound, "NOT_FOUND")
	expectError(t, do(t, http.MethodDelete, sb.URL+"/session/"+created.SessionID, nil), http.StatusNotFound, "NOT_FOUND")

	// An empty body creates a session in the default directory.
	decodeInto(t, do(t, http.MethodPost, sb.URL+"/session", nil), &created)
	evs = run(t, sb.URL+"/session/"+created.SessionID+"/run", execd.RunInSessionRequest{Command: "pwd"})
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"/workspace"}) {
		t.Fatalf("default session directory %q", got)
	}
}

func TestAccessTokenInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{Flags: []string{"--access-token", "s3cret"}})
	expect(t, do(t, http.MethodGet, sb.URL+"/ping", nil), http.StatusOK)
	expectError(t, do(t, http.MethodGet, sb.URL+"/metrics", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	expectError(t, do(t, http.MethodGet, sb.URL+"/metrics", nil, opensandbox.HeaderExecdAccessToken, "wrong"), http.StatusUnauthorized, "UNAUTHORIZED")
	var m execd.Metrics
	decodeInto(t, do(t, http.MethodGet, sb.URL+"/metrics", nil, opensandbox.HeaderExecdAccessToken, "s3cret", "OPEN-SANDBOX-API-KEY", "ignored"), &m)
	if m.CPUCount <= 0 || m.MemTotalMiB <= 0 || m.MemUsedMiB <= 0 || m.Timestamp == 0 {
		t.Fatalf("metrics %+v", m)
	}
	resp := do(t, http.MethodGet, sb.URL+"/metrics/watch", nil, opensandbox.HeaderExecdAccessToken, "s3cret")
	st := openStream(t, resp)
	for i := range 2 {
		ev, ok := st.next() // Metrics objects decode as events with only a timestamp
		if !ok || ev.Timestamp == 0 {
			t.Fatalf("watch event %d: %+v", i, ev)
		}
	}
	resp.Body.Close()
}
