package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// editableLibrary is a PolicyLibrary of one policy, "team", whose version the test
// moves (set) as the library moves on an edit of the file.
type editableLibrary struct {
	mu sync.Mutex
	p  library.Policy
}

func (l *editableLibrary) set(t *testing.T, version uint64, target string) {
	t.Helper()
	src := "defaultAction: deny\negress:\n  - action: allow\n    target: " + target + "\n"
	p, err := policies.Parse("team.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.p = library.Policy{Name: "team", Version: version, SHA256: strings.Repeat("0", 63) + string(rune('0'+version)),
		File: "team.yaml", Source: []byte(src), Policy: p}
}

func (l *editableLibrary) Get(name string) (library.Policy, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p, name == l.p.Name
}

func (l *editableLibrary) List() []library.Policy {
	l.mu.Lock()
	defer l.mu.Unlock()
	return []library.Policy{l.p}
}

// TestSnapshotPinSurvivesRestart: a restore from a snapshot of a sandbox under a named
// policy publishes to the data plane (the watch) the named policy's document at the
// snapshot's version while a fresh sandbox gets the library's current one; the pin is
// in the store (bbolt) and holds after a restart of the server, through another
// library change; PUT ?name= unpins.
func TestSnapshotPinSurvivesRestart(t *testing.T) {
	lib := &editableLibrary{}
	lib.set(t, 1, "a.test")
	dir := t.TempDir()
	h := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir, KeepContainers: true, Library: lib})
	t.Cleanup(func() { lctest.RemoveAll(t, h.Runtime) }) // should the test end before the restart
	t.Cleanup(func() {
		out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["extensions"] = map[string]string{lifecycle.ExtPolicy: "team"}
	src := c.create(req)
	c.waitState(src.ID, opensandbox.Running)
	var sn lifecycle.Snapshot
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{}, http.StatusAccepted, ""), &sn); err != nil {
		t.Fatal(err)
	}
	if sn = c.waitSnapshot(sn.ID); sn.Status.State != lifecycle.SnapshotReady {
		t.Fatalf("snapshot %+v", sn)
	}

	lib.set(t, 2, "b.test")
	h.Server.NamedPolicyChanged("team")
	restoreReq := map[string]any{"snapshotId": sn.ID, "timeout": 600, "resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"}}
	restored := c.create(restoreReq)
	fresh := c.create(req)
	c.waitState(restored.ID, opensandbox.Running)
	c.waitState(fresh.ID, opensandbox.Running)
	// published checks what the data plane learns of sandbox id through the watch.
	published := func(h *lctest.Harness, id, allowed string, version uint64) {
		t.Helper()
		w, ok := h.Server.Hub().Get(id)
		if !ok {
			t.Fatalf("%s not in the watch", id)
		}
		p, err := policies.Parse(id, w.Policy)
		if err != nil || len(p.Egress) != 1 || p.Egress[0].Target != allowed || w.PolicyVersion != version {
			t.Errorf("%s: the watch publishes version %d %s, want %s at version %d", id, w.PolicyVersion, w.Policy, allowed, version)
		}
	}
	published(h, restored.ID, "a.test", 2) // additions' version 1 + the snapshot's team v1
	published(h, fresh.ID, "b.test", 3)    // 1 + team v2
	published(h, src.ID, "b.test", 3)
	pinned := func(c *client, id string) *lifecycle.PinnedPolicy {
		t.Helper()
		var p lifecycle.PolicyResponse
		if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+id+"/policy", nil, http.StatusOK, ""), &p); err != nil {
			t.Fatal(err)
		}
		return p.Pinned
	}
	if p := pinned(c, restored.ID); p == nil || p.Version != 1 || p.LibraryVersion != 2 || p.SnapshotID != sn.ID {
		t.Errorf("pin of the restore: %+v", p)
	}
	if p := pinned(c, fresh.ID); p != nil {
		t.Errorf("a fresh sandbox is pinned: %+v", p)
	}

	// Restart: the pin is in the store; a library change meanwhile does not reach it.
	h.Stop()
	lib.set(t, 3, "c.test")
	h2 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir, Library: lib})
	c2 := newClient(t, h2)
	c2.waitState(restored.ID, opensandbox.Running)
	published(h2, restored.ID, "a.test", 2)
	published(h2, fresh.ID, "c.test", 4)
	if p := pinned(c2, restored.ID); p == nil || p.Version != 1 || p.LibraryVersion != 3 {
		t.Errorf("pin of the restore after a restart: %+v", p)
	}

	// PUT ?name= unpins: the restore follows the library, at a higher version.
	c2.want("PUT", "/v1/sandboxes/"+restored.ID+"/policy?name=team", nil, http.StatusOK, "")
	published(h2, restored.ID, "c.test", 4)
	if p := pinned(c2, restored.ID); p != nil {
		t.Errorf("still pinned after PUT ?name=: %+v", p)
	}
	c2.want("DELETE", "/v1/snapshots/"+sn.ID, nil, http.StatusNoContent, "")
}
