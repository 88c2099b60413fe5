package execd_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/opensandbox"
)

const ptyWait = 20 * time.Second

// ptyAPI is a PTY session's REST side with the sandbox's execd token.
type ptyAPI struct {
	base, token string
}

func (a ptyAPI) hdr() []string { return []string{opensandbox.HeaderExecdAccessToken, a.token} }

func (a ptyAPI) create(t *testing.T, req execd.CreatePTYRequest) string {
	t.Helper()
	var out execd.CreatePTYResponse
	if err := json.Unmarshal(expect(t, do(t, "POST", a.base+"/pty", req, a.hdr()...), http.StatusCreated), &out); err != nil || len(out.SessionID) != 32 {
		t.Fatalf("POST /pty: %+v %v", out, err)
	}
	return out.SessionID
}

func (a ptyAPI) status(t *testing.T, id string) execd.PTYStatus {
	t.Helper()
	var st execd.PTYStatus
	if err := json.Unmarshal(expect(t, do(t, "GET", a.base+"/pty/"+id, nil, a.hdr()...), http.StatusOK), &st); err != nil || st.SessionID != id {
		t.Fatalf("GET /pty/%s: %+v %v", id, st, err)
	}
	return st
}

func (a ptyAPI) ws(id, query string) string {
	u := "ws" + strings.TrimPrefix(a.base, "http") + "/pty/" + id + "/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

func (a ptyAPI) dial(t *testing.T, id, query string) *execdtest.PTYClient {
	t.Helper()
	c := execdtest.MustDialPTY(t, a.ws(id, query), http.Header{opensandbox.HeaderExecdAccessToken: {a.token}}, nil)
	return c
}

// dialStatus dials and returns the refused handshake's status and error code.
func (a ptyAPI) dialStatus(t *testing.T, id, query, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ptyWait)
	defer cancel()
	c, resp, err := execdtest.DialPTY(ctx, a.ws(id, query), http.Header{opensandbox.HeaderExecdAccessToken: {token}}, nil)
	if err == nil {
		c.WS.CloseNow()
		t.Fatalf("dial %s?%s succeeded", id, query)
	}
	if resp == nil {
		t.Fatalf("dial %s?%s: %v", id, query, err)
	}
	var e opensandbox.ErrorBody
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Code
}

// TestPTYInSandbox drives one PTY session in a real sandbox through its whole life:
// create, token check, a terminal (tty, resize, ^C), 409 for a second client, replay of
// the output missed while disconnected, takeover, the exit frame and delete.
func TestPTYInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{Flags: []string{"--access-token", "pty-token"}})
	a := ptyAPI{base: sb.URL, token: "pty-token"}

	expectError(t, do(t, "POST", a.base+"/pty", execd.CreatePTYRequest{}), http.StatusUnauthorized, "UNAUTHORIZED")
	id := a.create(t, execd.CreatePTYRequest{Cwd: "/tmp/pty-work"})
	if st := a.status(t, id); st.Running || st.LaunchAttempted || st.OutputOffset != 0 {
		t.Fatalf("a fresh session: %+v", st)
	}
	if st, code := a.dialStatus(t, id, "", "wrong"); st != http.StatusUnauthorized || code != "UNAUTHORIZED" {
		t.Fatalf("dial with a wrong token: %d %s", st, code)
	}
	if st, code := a.dialStatus(t, "nosuchsession", "", a.token); st != http.StatusNotFound || code != "NOT_FOUND" {
		t.Fatalf("dial of an unknown session: %d %s", st, code)
	}
	if st, code := a.dialStatus(t, id, "since=-1", a.token); st != http.StatusBadRequest {
		t.Fatalf("dial with since=-1: %d %s", st, code)
	}

	c1 := a.dial(t, id, "")
	if f := c1.WaitFor(t, "connected", ptyWait); f.JSON.SessionID != id || f.JSON.Mode != "pty" {
		t.Fatalf("connected frame %+v", f.JSON)
	}
	c1.Stdin(t, "pwd; tty; echo term=$TERM\n")
	c1.Expect(t, "/tmp/pty-work", ptyWait)
	c1.Expect(t, "term=xterm-256color", ptyWait)
	if !strings.Contains(c1.Out.String(), "/dev/pts/") {
		t.Fatalf("stdin is not a terminal: %q", c1.Out.String())
	}
	if st := a.status(t, id); !st.Running || !st.LaunchAttempted || st.LaunchFailed || st.OutputOffset == 0 {
		t.Fatalf("a running session: %+v", st)
	}

	t.Run("resize", func(t *testing.T) {
		c1.Stdin(t, "stty size\n")
		c1.Expect(t, "24 80", ptyWait)
		c1.Send(t, execd.PTYClientFrame{Type: "resize", Cols: 123, Rows: 45})
		c1.Stdin(t, "stty size\n")
		c1.Expect(t, "45 123", ptyWait)
	})

	t.Run("sigint_interrupts_the_foreground_command", func(t *testing.T) {
		// The child prints once it is the terminal's foreground job (bash hands it the
		// terminal before it runs), then becomes sleep.
		c1.Stdin(t, "sh -c 'echo running-$((1+1)); exec sleep 100'; echo after-$((2+3))\n")
		c1.Expect(t, "running-2", ptyWait)
		c1.Send(t, execd.PTYClientFrame{Type: "signal", Signal: "SIGINT"})
		c1.Stdin(t, "echo alive-$((3+4))\n")
		if out := c1.Expect(t, "alive-7", ptyWait); strings.Contains(out, "after-5") {
			t.Fatalf("the interrupted list went on: %q", out)
		}
	})

	t.Run("ping_and_bad_frames", func(t *testing.T) {
		c1.Send(t, execd.PTYClientFrame{Type: "ping"})
		c1.WaitFor(t, "pong", ptyWait)
		c1.Send(t, execd.PTYClientFrame{Type: "bogus"})
		if f := c1.WaitFor(t, "error", ptyWait); f.JSON.Code != "INVALID_FRAME" {
			t.Fatalf("error frame %+v", f.JSON)
		}
		c1.Send(t, execd.PTYClientFrame{Type: "signal", Signal: "SIGNOPE"})
		if f := c1.WaitFor(t, "error", ptyWait); f.JSON.Code != "INVALID_FRAME" {
			t.Fatalf("error frame %+v", f.JSON)
		}
	})

	t.Run("second_client_gets_409", func(t *testing.T) {
		if st, code := a.dialStatus(t, id, "", a.token); st != http.StatusConflict || code != "ALREADY_CONNECTED" {
			t.Fatalf("second client: %d %s", st, code)
		}
	})

	var c2 *execdtest.PTYClient
	outer := t // c2 outlives the subtest
	replayed := t.Run("replay_since_offset", func(t *testing.T) {
		// bash must sit at its prompt first: a line typed while it is still busy is
		// echoed by the terminal, then drawn again with the prompt when readline
		// starts, after the offset taken below. The new prompt is spelt apart in the
		// typed line, so only bash's drawing of it matches.
		c1.Stdin(t, "PS1='rea''dy> '\n")
		c1.Expect(t, "ready> ", ptyWait)
		// 5000 bytes after the marker: once the offset moved that far, the marker is in.
		c1.Stdin(t, "sleep 2; echo missed-$((40+2)); printf '%05000d\\n' 0\n")
		c1.Expect(t, "missed-$((40+2))", ptyWait) // the terminal's echo of the line
		c1.WS.CloseNow()
		since := a.status(t, id).OutputOffset
		deadline := time.Now().Add(ptyWait)
		for a.status(t, id).OutputOffset < since+5000 {
			if time.Now().After(deadline) {
				t.Fatal("no output while disconnected")
			}
			time.Sleep(100 * time.Millisecond)
		}
		c2 = a.dial(outer, id, "since="+strconv.FormatInt(since, 10))
		c2.WaitFor(t, "connected", ptyWait)
		f := c2.WaitFor(t, "replay", ptyWait)
		if f.Offset != since || !strings.Contains(string(f.Data), "missed-42") || strings.Contains(string(f.Data), "$((40+2))") {
			t.Fatalf("replay at %d (want %d): %q", f.Offset, since, f.Data)
		}
		c2.Stdin(t, "echo back-$((6*7))\n")
		c2.Expect(t, "back-42", ptyWait)
	})
	if !replayed {
		t.FailNow()
	}

	c3 := a.dial(t, id, "takeover=1&since=0")
	t.Run("takeover", func(t *testing.T) {
		c3.WaitFor(t, "connected", ptyWait)
		if f := c3.WaitFor(t, "replay", ptyWait); f.Offset != 0 || !strings.Contains(string(f.Data), "back-42") {
			t.Fatalf("takeover replay at %d, %d bytes (output offset now %d): %q", f.Offset, len(f.Data), a.status(t, id).OutputOffset, f.Data)
		}
		if f := c2.WaitFor(t, "closed", ptyWait); f.CloseCode != execd.PTYCloseTakenOver {
			t.Fatalf("the evicted holder was closed with %d (%v), want 4001", f.CloseCode, f.Err)
		}
		c3.Stdin(t, "echo taken-$((5*5))\n")
		c3.Expect(t, "taken-25", ptyWait)
	})

	t.Run("exit_frame", func(t *testing.T) {
		c3.Stdin(t, "exit 7\n")
		if f := c3.WaitFor(t, "exit", ptyWait); f.JSON.ExitCode == nil || *f.JSON.ExitCode != 7 {
			t.Fatalf("exit frame %+v", f.JSON)
		}
		if f := c3.WaitFor(t, "closed", ptyWait); f.CloseCode != 1000 {
			t.Fatalf("closed with %d (%v), want 1000", f.CloseCode, f.Err)
		}
		if st := a.status(t, id); st.Running {
			t.Fatalf("after exit: %+v", st)
		}
	})

	expect(t, do(t, "DELETE", a.base+"/pty/"+id, nil, a.hdr()...), http.StatusOK)
	expectError(t, do(t, "GET", a.base+"/pty/"+id, nil, a.hdr()...), http.StatusNotFound, "NOT_FOUND")
	expectError(t, do(t, "DELETE", a.base+"/pty/"+id, nil, a.hdr()...), http.StatusNotFound, "NOT_FOUND")
}

// TestPTYPipeMode: ?pty=0 runs the shell without a terminal, stdout and stderr on their
// own channels; SIGINT ends the shell and the exit frame says so (128+2).
func TestPTYPipeMode(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	a := ptyAPI{base: sb.URL}
	id := a.create(t, execd.CreatePTYRequest{})
	c := a.dial(t, id, "pty=0")
	if f := c.WaitFor(t, "connected", ptyWait); f.JSON.Mode != "pipe" {
		t.Fatalf("connected frame %+v", f.JSON)
	}
	c.Stdin(t, "echo out-$((1)); echo err-$((2)) >&2; test -t 0 || echo no-tty\n")
	var stdout, stderr string
	for deadline := time.Now().Add(ptyWait); !strings.Contains(stdout, "no-tty") || !strings.Contains(stderr, "err-2"); {
		f := c.Next(time.Until(deadline))
		switch f.Type {
		case "stdout":
			stdout += string(f.Data)
		case "stderr":
			stderr += string(f.Data)
		default:
			t.Fatalf("frame %s (%v); stdout %q stderr %q", f.Type, f.Err, stdout, stderr)
		}
	}
	if stdout != "out-1\nno-tty\n" || stderr != "err-2\n" {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
	// Whether it reaches sleep or the shell itself first, SIGINT ends the shell.
	c.Stdin(t, "sleep 100\n")
	c.Send(t, execd.PTYClientFrame{Type: "signal", Signal: "INT"})
	if f := c.WaitFor(t, "exit", ptyWait); f.JSON.ExitCode == nil || *f.JSON.ExitCode != 130 {
		t.Fatalf("exit frame %+v", f.JSON)
	}
}

// TestPTYCommandDelete: a session with a command runs it on a terminal; DELETE kills it
// and its client gets the exit frame (SIGKILL: 137).
func TestPTYCommandDelete(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	a := ptyAPI{base: sb.URL}
	id := a.create(t, execd.CreatePTYRequest{Command: "echo cmd-$((9*9)); exec sleep 100"})
	c := a.dial(t, id, "")
	c.WaitFor(t, "connected", ptyWait)
	c.Expect(t, "cmd-81", ptyWait)
	expect(t, do(t, "DELETE", a.base+"/pty/"+id, nil), http.StatusOK)
	if f := c.WaitFor(t, "exit", ptyWait); f.JSON.ExitCode == nil || *f.JSON.ExitCode != 137 {
		t.Fatalf("exit frame %+v", f.JSON)
	}
}

// TestPTYExitWithLeftoverChild: a shell that exits while a background child still holds
// its terminal ends all the same (exit frame with its status): execd stops reading the
// terminal shortly after the shell exited.
func TestPTYExitWithLeftoverChild(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	a := ptyAPI{base: sb.URL}
	id := a.create(t, execd.CreatePTYRequest{Command: "sh -c 'trap \"\" HUP; exec sleep 1000' & echo bg-$((2*3)); exit 3"})
	c := a.dial(t, id, "")
	c.Expect(t, "bg-6", ptyWait)
	if f := c.WaitFor(t, "exit", ptyWait); f.JSON.ExitCode == nil || *f.JSON.ExitCode != 3 {
		t.Fatalf("exit frame %+v", f.JSON)
	}
	if st := a.status(t, id); st.Running {
		t.Fatalf("after exit: %+v", st)
	}
}

// TestPTYTakeoverDuringFlood: a holder is evicted even while the shell never stops
// writing, and the new holder gets the stream.
func TestPTYTakeoverDuringFlood(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	a := ptyAPI{base: sb.URL}
	id := a.create(t, execd.CreatePTYRequest{Command: "yes flood-line"})
	c1 := a.dial(t, id, "")
	c1.Expect(t, "flood-line", ptyWait)
	c2 := a.dial(t, id, "takeover=1&since=999999999999")
	for deadline := time.Now().Add(ptyWait); ; {
		f := c1.Next(time.Until(deadline))
		if f.Type == "closed" {
			if f.CloseCode != execd.PTYCloseTakenOver {
				t.Fatalf("the evicted holder was closed with %d (%v), want 4001", f.CloseCode, f.Err)
			}
			break
		}
		if f.Type == "timeout" {
			t.Fatal("the holder of a flooding shell was never evicted")
		}
	}
	c2.WaitFor(t, "connected", ptyWait)
	c2.Expect(t, "flood-line", ptyWait)
	expect(t, do(t, "DELETE", a.base+"/pty/"+id, nil), http.StatusOK)
	c2.WaitFor(t, "exit", ptyWait)
}
