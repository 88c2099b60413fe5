package egressd

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestGroupsAPI: the process group node API answers only the API key (401); a start
// for a sandbox this node does not run is 404, an end with a body that is not
// GroupsEnd 400 and of an unknown watch 404 (JSON errors); a real command started by
// the sandbox's init (a shell in a group of its own, as Runtime.Pid) after the start is
// found and taken by the end, once; GroupsPerSandbox watches of one sandbox are open at most.
func TestGroupsAPI(t *testing.T) {
	const key = "node-key"
	d := &Daemon{log: slog.New(slog.DiscardHandler), byID: map[string]*sandbox{
		"sbx1": {view: watch.Sandbox{ID: "sbx1", Runtime: watch.Runtime{Pid: os.Getpid()}}},
		"sbx2": {view: watch.Sandbox{ID: "sbx2", Runtime: watch.Runtime{Pid: os.Getpid()}}},
	}}
	h := d.GroupsHandler(key)
	call := func(path, sentKey, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if sentKey != "" {
			req.Header.Set(opensandbox.HeaderAPIKey, sentKey)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK && rec.Code != http.StatusCreated {
			var e opensandbox.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
				t.Errorf("POST %s: %d with a body that is no JSON error: %q", path, rec.Code, rec.Body)
			}
		}
		return rec
	}
	start := func(id string) string {
		t.Helper()
		rec := call(execdaudit.GroupsPath+id, key, "")
		var s execdaudit.GroupsStarted
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &s) != nil || len(s.ID) != 32 {
			t.Fatalf("starting a watch of %s: %d %s", id, rec.Code, rec.Body)
		}
		return s.ID
	}

	for _, c := range []struct {
		name, path, key, body string
		want                  int
	}{
		{"StartNoKey", execdaudit.GroupsPath + "sbx1", "", "", http.StatusUnauthorized},
		{"StartWrongKey", execdaudit.GroupsPath + "sbx1", "other", "", http.StatusUnauthorized},
		{"EndNoKey", execdaudit.GroupsPath + "sbx1/0123/end", "", `{"take":true}`, http.StatusUnauthorized},
		{"StartUnknownSandbox", execdaudit.GroupsPath + "nosuch", key, "", http.StatusNotFound},
		{"EndUnknownWatch", execdaudit.GroupsPath + "sbx1/0123/end", key, `{"take":true}`, http.StatusNotFound},
		{"EndNotJSON", execdaudit.GroupsPath + "sbx1/0123/end", key, `{"take":`, http.StatusBadRequest},
		{"EndUnknownField", execdaudit.GroupsPath + "sbx1/0123/end", key, `{"take":true,"pgid":1}`, http.StatusBadRequest},
		{"EndNoBody", execdaudit.GroupsPath + "sbx1/0123/end", key, ``, http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			if rec := call(c.path, c.key, c.body); rec.Code != c.want {
				t.Errorf("POST %s: %d %s, want %d", c.path, rec.Code, rec.Body, c.want)
			}
		})
	}

	t.Run("RealGroup", func(t *testing.T) {
		// The sandbox's init is a process and group of its own (not this test process,
		// whose other children would be groups of the init too). Once the watch has
		// started, it starts a command as execd does: a child of the init in a group of
		// its own (setsid), which has ended by the end (the watch saw it while it ran).
		init := exec.Command("sh", "-c", "read go; setsid sleep 0.3 & echo $!; wait; exec sleep 60")
		init.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdin, _ := init.StdinPipe()
		stdout, _ := init.StdoutPipe()
		if err := init.Start(); err != nil {
			t.Fatal(err)
		}
		d.byID["sbx1"].view.Runtime.Pid = init.Process.Pid
		t.Cleanup(func() {
			init.Process.Kill()
			init.Wait()
			d.byID["sbx1"].view.Runtime.Pid = os.Getpid()
		})
		wid := start("sbx1")
		if _, err := stdin.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		pgid, _ := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || pgid <= 0 {
			t.Fatalf("the init's command: %q %v", line, err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pgid)); os.IsNotExist(err) {
				break // ended and reaped by the init
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command %d has not ended", pgid)
			}
		}
		// Another sandbox's watch of the same end: the watch is sbx1's.
		if rec := call(execdaudit.GroupsPath+"sbx2/"+wid+"/end", key, `{"take":true}`); rec.Code != http.StatusNotFound {
			t.Errorf("ending sbx1's watch as sbx2's: %d %s, want 404", rec.Code, rec.Body)
		}
		rec := call(execdaudit.GroupsPath+"sbx1/"+wid+"/end", key, `{"take":true}`)
		var got execdaudit.GroupsEnded
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil {
			t.Fatalf("ending the watch: %d %s", rec.Code, rec.Body)
		}
		if len(got.Groups) != 1 || got.Groups[0].PGID != pgid || got.Ambiguous {
			t.Errorf("the watch took %+v (ambiguous %v), want the command's group %d", got.Groups, got.Ambiguous, pgid)
		}
		if rec := call(execdaudit.GroupsPath+"sbx1/"+wid+"/end", key, `{"take":true}`); rec.Code != http.StatusNotFound {
			t.Errorf("ending the watch again: %d %s, want 404", rec.Code, rec.Body)
		}
		// A group taken once is not taken again by a later watch.
		wid = start("sbx1")
		rec = call(execdaudit.GroupsPath+"sbx1/"+wid+"/end", key, `{"take":true}`)
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK || len(got.Groups) != 0 {
			t.Errorf("a watch with no new command: %d %s, want no group", rec.Code, rec.Body)
		}
	})

	t.Run("PerSandboxCap", func(t *testing.T) {
		var ids []string
		for range execdaudit.GroupsPerSandbox {
			ids = append(ids, start("sbx2"))
		}
		if rec := call(execdaudit.GroupsPath+"sbx2", key, ""); rec.Code != http.StatusTooManyRequests {
			t.Errorf("watch %d of one sandbox: %d %s, want 429", execdaudit.GroupsPerSandbox+1, rec.Code, rec.Body)
		}
		start("sbx1") // another sandbox's are not counted
		if rec := call(execdaudit.GroupsPath+"sbx2/"+ids[0]+"/end", key, `{"take":false}`); rec.Code != http.StatusOK {
			t.Fatalf("ending a watch: %d %s", rec.Code, rec.Body)
		}
		ids[0] = start("sbx2") // room again
		for _, id := range ids {
			call(execdaudit.GroupsPath+"sbx2/"+id+"/end", key, `{"take":false}`)
		}
	})
}

// TestPodInit: a pod's init is the process of one of its container cgroups that is 1
// in its pid namespace and named execd; the pause container's process (also 1, named
// pause) and the others are not.
func TestPodInit(t *testing.T) {
	cg := t.TempDir()
	proc := t.TempDir()
	old := procRoot
	procRoot = proc
	t.Cleanup(func() { procRoot = old })
	const uid = "1234-abcd"
	writeFile(t, filepath.Join(cg, "cgroup.controllers"), "")
	pod := filepath.Join(cg, "kubepods", "besteffort", "pod"+uid)
	writeFile(t, filepath.Join(pod, "cgroup.procs"), "")
	writeFile(t, filepath.Join(pod, "pausectr", "cgroup.procs"), "700\n")
	writeFile(t, filepath.Join(pod, "mainctr", "cgroup.procs"), "801\n800\n")
	for pid, v := range map[int][2]string{700: {"pause", "700\t1"}, 800: {"execd", "800\t1"}, 801: {"execd", "801\t7"}} {
		writeFile(t, filepath.Join(proc, strconv.Itoa(pid), "comm"), v[0]+"\n")
		writeFile(t, filepath.Join(proc, strconv.Itoa(pid), "status"), "Name:\t"+v[0]+"\nNSpid:\t"+v[1]+"\n")
	}
	got, err := podInit(cg, uid)
	if err != nil || got != 800 {
		t.Errorf("podInit: %d, %v; want 800", got, err)
	}
	if _, err := podInit(cg, "other-uid"); err == nil {
		t.Error("podInit of a pod without a cgroup: no error")
	}
	writeFile(t, filepath.Join(pod, "mainctr", "cgroup.procs"), "801\n")
	if got, err := podInit(cg, uid); err == nil {
		t.Errorf("podInit without execd as 1: %d, want an error", got)
	}
}

// TestPodInitCached: a pod's init is found once and then checked by its start time: the
// cache answers while the process is the same (even with its cgroup's list changed),
// and looks again once the pid is another process's.
func TestPodInitCached(t *testing.T) {
	cg, proc := t.TempDir(), t.TempDir()
	old := procRoot
	procRoot = proc
	t.Cleanup(func() { procRoot = old })
	const uid = "5678-cafe"
	stat := func(start int) string {
		return "900 (execd) S 1 900 900 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 " + strconv.Itoa(start) + " 0 0\n"
	}
	writeFile(t, filepath.Join(cg, "cgroup.controllers"), "")
	ctr := filepath.Join(cg, "kubepods", "pod"+uid, "mainctr", "cgroup.procs")
	writeFile(t, ctr, "900\n")
	writeFile(t, filepath.Join(proc, "900", "comm"), "execd\n")
	writeFile(t, filepath.Join(proc, "900", "status"), "Name:\texecd\nNSpid:\t900\t1\n")
	writeFile(t, filepath.Join(proc, "900", "stat"), stat(4242))
	g := &groupWatches{d: &Daemon{cfg: Config{CgroupRoot: cg}}, inits: map[string]podInitEntry{}}
	if pid, err := g.podInit(uid); err != nil || pid != 900 {
		t.Fatalf("first look: %d, %v; want 900", pid, err)
	}
	writeFile(t, ctr, "") // a walk would find nothing now
	if pid, err := g.podInit(uid); err != nil || pid != 900 {
		t.Fatalf("the same process again: %d, %v; want 900 from the cache", pid, err)
	}
	writeFile(t, filepath.Join(proc, "900", "stat"), stat(5000)) // pid 900 is another process
	if pid, err := g.podInit(uid); err == nil {
		t.Fatalf("after the init's pid was reused: %d, want the walk's error", pid)
	}
	if _, ok := g.inits[uid]; ok {
		t.Error("a failed look leaves its pod in the cache")
	}
}

// writeFile writes s to p, making its directories.
func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
