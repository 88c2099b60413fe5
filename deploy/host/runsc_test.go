package host

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
)

// fakeEngine serves /_ping and /info on h's socket as the Docker engine does; /info
// lists runtime runsc once listed is true.
func fakeEngine(t *testing.T, h *fakeHost, listed *atomic.Bool) {
	t.Helper()
	ln, err := net.Listen("unix", h.socket)
	must(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/_ping":
			_, _ = w.Write([]byte("OK"))
		case "/info":
			rt := `{"runc":{"path":"runc"}}`
			if listed.Load() {
				rt = `{"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=host"]}}`
			}
			_, _ = w.Write([]byte(`{"ID":"fake","Runtimes":` + rt + `,"DefaultRuntime":"runc"}`))
		default:
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestPlanRegistersRunsc: a host whose engine runs without gVisor gets runsc added to
// daemon.json and the engine reloaded; one whose daemon.json and engine have it, nothing.
func TestPlanRegistersRunsc(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.SkipOrFail(t, "curl not installed: run deploy/host/prepare.sh")
	}
	commands, files := allExcept("curl")
	h := newFakeHost(t, commands, files, true)
	must(t, os.Symlink(curl, filepath.Join(h.bin, "curl")))
	var listed atomic.Bool
	fakeEngine(t, h, &listed)

	lines := h.plan(t)
	for _, want := range []string{
		"plan: add runtime runsc (--network=host) to " + h.daemonJSON,
		"plan: reload the engine so it lists runtime runsc",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("engine without runsc: plan lacks %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	must(t, os.MkdirAll(filepath.Dir(h.daemonJSON), 0o755))
	must(t, os.WriteFile(h.daemonJSON, []byte(`{"runtimes":{"runsc":{"path":"/usr/bin/runsc"}}}`), 0o644))
	listed.Store(true)
	lines = h.plan(t)
	for _, want := range []string{"plan: ok runtime runsc in " + h.daemonJSON, "plan: ok engine lists runtime runsc"} {
		if !slices.Contains(lines, want) {
			t.Errorf("engine with runsc: plan lacks %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
}

// TestRegisterRunscForReal runs prepare.sh for real on a host where every package is
// present and the engine answers without runsc (a fresh machine after the package
// step): the real `runsc install` adds runsc to a daemon.json holding another key, the
// engine (this test, through the pid file) gets SIGHUP, and a second run changes
// nothing and signals nobody.
func TestRegisterRunscForReal(t *testing.T) {
	testenv.NeedRoot(t)
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.SkipOrFail(t, "curl not installed: run deploy/host/prepare.sh")
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		testenv.SkipOrFail(t, "runsc not installed: run deploy/host/prepare.sh")
	}
	commands, files := allExcept("curl", "runsc", "node", "npm")
	h := newFakeHost(t, commands, files, true)
	must(t, os.Symlink(curl, filepath.Join(h.bin, "curl")))
	must(t, os.Symlink(runsc, filepath.Join(h.bin, "runsc")))
	for _, c := range []string{"cat", "mkdir", "seq", "sleep", "sed", "head"} {
		p, err := exec.LookPath(c)
		must(t, err)
		must(t, os.Symlink(p, filepath.Join(h.bin, c)))
	}
	var listed atomic.Bool
	var reloads atomic.Int32
	fakeEngine(t, h, &listed)
	hup := make(chan os.Signal, 4)
	signal.Notify(hup, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(hup); close(hup) })
	go func() {
		// The engine reloads: from then on it lists runsc.
		for range hup {
			reloads.Add(1)
			listed.Store(true)
		}
	}()
	must(t, os.WriteFile(h.pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644))
	must(t, os.MkdirAll(filepath.Dir(h.daemonJSON), 0o755))
	must(t, os.WriteFile(h.daemonJSON, []byte(`{"log-level":"warn"}`), 0o644))

	out, err := h.run("--no-node")
	if err != nil {
		t.Fatalf("prepare.sh: %v\n%s", err, out)
	}
	if reloads.Load() != 1 {
		t.Fatalf("the engine was reloaded %d times, want 1:\n%s", reloads.Load(), out)
	}
	b, err := os.ReadFile(h.daemonJSON)
	must(t, err)
	var cfg struct {
		LogLevel string `json:"log-level"`
		Runtimes map[string]struct {
			Path        string   `json:"path"`
			RuntimeArgs []string `json:"runtimeArgs"`
		} `json:"runtimes"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("daemon.json is not JSON after prepare: %v\n%s", err, b)
	}
	rs, ok := cfg.Runtimes["runsc"]
	if cfg.LogLevel != "warn" || !ok || !slices.Equal(rs.RuntimeArgs, []string{"--network=host"}) || rs.Path == "" {
		t.Errorf("daemon.json after prepare = %s, want log-level kept and runsc with --network=host", b)
	}
	fi, err := os.Stat(h.daemonJSON)
	must(t, err)

	// Idempotent: nothing to do the second time.
	time.Sleep(10 * time.Millisecond)
	out, err = h.run("--no-node")
	if err != nil {
		t.Fatalf("prepare.sh, second run: %v\n%s", err, out)
	}
	if strings.Contains(out, "reloading") || strings.Contains(out, "adding runtime") {
		t.Errorf("second run did work again:\n%s", out)
	}
	if fi2, err := os.Stat(h.daemonJSON); err != nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("second run rewrote daemon.json (%v)", err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := reloads.Load(); n != 1 {
		t.Errorf("second run signalled the engine (%d reloads in all)", n)
	}

	// An engine that does not list runsc and cannot be reloaded fails the run with a
	// pointer, rather than passing on a host where docker.runtime: runsc cannot work.
	listed.Store(false)
	must(t, os.WriteFile(h.pidfile, []byte("999999999\n"), 0o644))
	if out, err := h.run("--no-node"); err == nil || !strings.Contains(out, "cannot signal the engine") {
		t.Errorf("engine without runsc and no live pid: err %v\n%s", err, out)
	}
}
