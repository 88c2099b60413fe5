package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// TestSnapshotOwners: a user principal's snapshots are its own, as its sandboxes are.
// Another user neither lists, reads, deletes nor restores them (404 SNAPSHOT_NOT_FOUND,
// as for a snapshot that does not exist); the owner and an admin do.
func TestSnapshotOwners(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	admin := newClient(t, h)
	t.Cleanup(func() {
		out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})
	userA := admin.as(admin.newKey("agent a", principal.User).Key)
	userB := admin.as(admin.newKey("agent b", principal.User).Key)

	src := userA.create(baseReq(h.Image, nil))
	userA.waitState(src.ID, opensandbox.Running)
	var acc lifecycle.Snapshot
	if err := json.Unmarshal(userA.want("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "mine"}, http.StatusAccepted, ""), &acc); err != nil {
		t.Fatal(err)
	}
	if sn := userA.waitSnapshot(acc.ID); sn.Status.State != lifecycle.SnapshotReady {
		t.Fatalf("snapshot %+v", sn)
	}

	listed := func(c *client) int {
		var l lifecycle.ListSnapshotsResponse
		if err := json.Unmarshal(c.want("GET", "/v1/snapshots", nil, http.StatusOK, ""), &l); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	if n := listed(userA); n != 1 {
		t.Errorf("the owner lists %d snapshots, want 1", n)
	}
	if n := listed(admin); n != 1 {
		t.Errorf("the admin lists %d snapshots, want 1", n)
	}
	if n := listed(userB); n != 0 {
		t.Errorf("another user lists %d snapshots, want 0", n)
	}
	userB.want("GET", "/v1/snapshots/"+acc.ID, nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
	userB.want("DELETE", "/v1/snapshots/"+acc.ID, nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
	userB.want("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{}, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	restore := baseReq(h.Image, nil)
	delete(restore, "image")
	restore["snapshotId"] = acc.ID
	userB.want("POST", "/v1/sandboxes", restore, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")

	// The owner restores it, and the restored sandbox is the owner's.
	got := userA.create(restore)
	userA.waitState(got.ID, opensandbox.Running)
	userB.want("GET", "/v1/sandboxes/"+got.ID, nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	userA.want("DELETE", "/v1/sandboxes/"+got.ID, nil, http.StatusNoContent, "")
	userA.want("DELETE", "/v1/snapshots/"+acc.ID, nil, http.StatusNoContent, "")
	userA.want("DELETE", "/v1/sandboxes/"+src.ID, nil, http.StatusNoContent, "")
}
