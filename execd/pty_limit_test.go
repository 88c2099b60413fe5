package execd_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockdev/airlock/execd"
)

// TestPTYSessionLimit: POST /pty past Config.MaxPTYSessions answers 409
// PTY_LIMIT_EXCEEDED with a message and creates nothing; deleting a session makes room;
// zero is DefaultMaxPTYSessions and a negative limit none.
func TestPTYSessionLimit(t *testing.T) {
	serve := func(max int) ptyAPI {
		s, err := execd.New(execd.Config{Workdir: t.TempDir(), StateDir: t.TempDir(), MaxPTYSessions: max})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(ts.Close)
		return ptyAPI{base: ts.URL}
	}
	t.Run("configured", func(t *testing.T) {
		a := serve(2)
		first := a.create(t, execd.CreatePTYRequest{})
		a.create(t, execd.CreatePTYRequest{})
		expectError(t, do(t, "POST", a.base+"/pty", execd.CreatePTYRequest{}), http.StatusConflict, "PTY_LIMIT_EXCEEDED")
		expect(t, do(t, "DELETE", a.base+"/pty/"+first, nil), http.StatusOK)
		a.create(t, execd.CreatePTYRequest{})
		expectError(t, do(t, "POST", a.base+"/pty", execd.CreatePTYRequest{}), http.StatusConflict, "PTY_LIMIT_EXCEEDED")
	})
	t.Run("default", func(t *testing.T) {
		a := serve(0)
		for range execd.DefaultMaxPTYSessions {
			a.create(t, execd.CreatePTYRequest{})
		}
		expectError(t, do(t, "POST", a.base+"/pty", execd.CreatePTYRequest{}), http.StatusConflict, "PTY_LIMIT_EXCEEDED")
	})
	t.Run("unlimited", func(t *testing.T) {
		a := serve(-1)
		for range execd.DefaultMaxPTYSessions + 4 {
			a.create(t, execd.CreatePTYRequest{})
		}
	})
}
