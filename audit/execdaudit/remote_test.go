package execdaudit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/opensandbox"
)

// execdChildEnv makes the test binary an execd serving on a loopback port it prints,
// in the working directory the variable names, until its stdin closes.
const execdChildEnv = "AIRLOCK_EXECDAUDIT_EXECD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(execdChildEnv); dir != "" {
		execdChildMain(dir)
		return
	}
	os.Exit(m.Run())
}

func execdChildMain(dir string) {
	srv, err := execd.New(execd.Config{Addr: "127.0.0.1:0", Workdir: dir})
	if err != nil {
		fmt.Println("setup", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("setup", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	_ = srv.Serve(ctx, ln)
}

// execdProcess starts an execd in a process and process group of its own (the
// sandbox's init as far as a group watch goes: its commands are its children and
// nothing else's): its URL and pid.
func execdProcess(t *testing.T) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), execdChildEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	// A group of its own, as a sandbox's init (pid 1) has: a command's process, between
	// its fork and its setpgid, is in its parent's group, which a watch passes over when
	// it is the init's own. In the test process's group it was a second candidate
	// whenever a scan fell in that window (CI failures, in this test and before it ran
	// execd in a process of its own).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "setup") {
		t.Fatalf("execd process: %q %v", line, err)
	}
	return "http://" + strings.TrimSpace(line), cmd.Process.Pid
}

// fakeNode serves GroupsPath as a node's egressd does (egressd.GroupsHandler, which
// cannot be imported here), with init (a pid) as the sandbox's init. It counts the
// starts.
func fakeNode(t *testing.T, key string, init int) (*httptest.Server, *int) {
	t.Helper()
	var mu sync.Mutex
	watches := map[string]GroupWatch{}
	starts := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+GroupsPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(opensandbox.HeaderAPIKey) != key || r.PathValue("id") != "sb1" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		starts++
		id := strings.Repeat("a", 31) + string(rune('a'+starts%26))
		watches[id] = WatchGroups(init, BootNow()-GroupsSlack)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(GroupsStarted{ID: id})
	})
	mux.HandleFunc("POST "+GroupsPath+"{id}/{watch}/end", func(w http.ResponseWriter, r *http.Request) {
		var req GroupsEnd
		if json.NewDecoder(r.Body).Decode(&req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		gw := watches[r.PathValue("watch")]
		delete(watches, r.PathValue("watch"))
		mu.Unlock()
		if gw == nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		g, ambi := gw.End(req.Take)
		_ = json.NewEncoder(w).Encode(GroupsEnded{Groups: g, Ambiguous: ambi})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &starts
}

// remoteInfo has the request's command group watched by rg on the node at srv's
// address (the gateway's wiring on Kubernetes).
func remoteInfo(rg *RemoteGroups, node string) func(*Info) {
	return func(in *Info) {
		id := in.SandboxID
		in.Groups = func() GroupWatch { return rg.Watch(node, id) }
	}
}

// TestRemoteGroups: a command through a proxy whose group source is a node's egressd
// (RemoteGroups) names, in extra.process_group, the process group the command itself
// reports (its /proc/self/stat pgrp). execd runs in a process and group of its own, the
// watched init, as in a sandbox.
func TestRemoteGroups(t *testing.T) {
	execdURL, execdPID := execdProcess(t)
	srv, starts := fakeNode(t, "k", execdPID)
	u, _ := url.Parse(srv.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	rg := NewRemoteGroups(atoi(port), "k", nil)
	base, s := proxyTo(t, execdURL, Config{}, remoteInfo(rg, host))

	out := post(t, base+"/command", "application/json", []byte(`{"command":"cut -d' ' -f5 /proc/self/stat"}`))
	var pgid int
	for _, line := range strings.Split(out, "\n") {
		var ev struct{ Type, Text string }
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data:")), &ev) == nil && ev.Type == "stdout" {
			pgid = atoi(strings.TrimSpace(ev.Text))
		}
	}
	if pgid <= 0 {
		t.Fatalf("the command's own group: none in %q", out)
	}
	r := one(t, s, "command")
	b, _ := json.Marshal(r.Extra["process_group"])
	var g ProcGroup
	if json.Unmarshal(b, &g) != nil || g.PGID != pgid {
		t.Errorf("the command's record names process group %s, want %d (the command's own): %+v", b, pgid, r.Extra)
	}
	if *starts != 1 {
		t.Errorf("%d watches started for one command, want 1", *starts)
	}
	// Not a command: no watch.
	post(t, base+"/directories", "application/json", []byte(`{"/tmp/x-remote-groups":{"mode":755}}`))
	s.take(1)
	if *starts != 1 {
		t.Errorf("%d watches started after a mkdir, want still 1", *starts)
	}
}

// TestRemoteGroupsFailing: with the node's egressd refusing connections, or accepting
// and never answering, a command answers as fast as without it and its record is
// still written, naming no group; the failure is logged once per sandbox under "err",
// and a node that did not answer is not asked again for a while.
func TestRemoteGroupsFailing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() { // accepts, never answers
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, nil))
	_, port, _ := net.SplitHostPort(l.Addr().String())
	rg := NewRemoteGroups(atoi(port), "k", log)
	base, s, _ := proxyFrontInfo(t, Config{}, remoteInfo(rg, "127.0.0.1"))

	for i := range 2 {
		start := time.Now()
		post(t, base+"/command", "application/json", []byte(`{"command":"echo hi"}`))
		if d := time.Since(start); d > time.Second {
			t.Errorf("command %d with a hung egressd took %v", i, d)
		}
		deadline := time.Now().Add(5 * time.Second)
		got := s.take(0)
		for len(got) == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			got = s.take(0)
		}
		if len(got) != 1 || got[0].Extra["op"] != "command" || got[0].Extra["process_group"] != nil {
			t.Fatalf("command %d's records with a hung egressd: %+v, want one command record without a group", i, got)
		}
	}
	logMu.Lock()
	text := logs.String()
	logMu.Unlock()
	if n := strings.Count(text, `"sandbox_id":"sb1"`); n != 1 || !strings.Contains(text, `"err":`) {
		t.Errorf("logged %d times (want once, key err): %s", n, text)
	}
	rg.mu.Lock()
	_, down := rg.down["http://127.0.0.1:"+port]
	rg.mu.Unlock()
	if !down {
		t.Error("the hung node is not backed off")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}
