package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// getSnapshot reads snapshot id.
func (c *client) getSnapshot(id string) lifecycle.Snapshot {
	c.t.Helper()
	var sn lifecycle.Snapshot
	if err := json.Unmarshal(c.want("GET", "/v1/snapshots/"+id, nil, http.StatusOK, ""), &sn); err != nil {
		c.t.Fatal(err)
	}
	return sn
}

// waitSnapshot polls snapshot id until it leaves Creating (at most 3 min).
func (c *client) waitSnapshot(id string) lifecycle.Snapshot {
	c.t.Helper()
	for range 1800 {
		if sn := c.getSnapshot(id); sn.Status.State != lifecycle.SnapshotCreating {
			return sn
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("snapshot %s still Creating after 3 min", id)
	return lifecycle.Snapshot{}
}

func (c *client) listSnapshots(query string) lifecycle.ListSnapshotsResponse {
	c.t.Helper()
	var l lifecycle.ListSnapshotsResponse
	if err := json.Unmarshal(c.want("GET", "/v1/snapshots?"+query, nil, http.StatusOK, ""), &l); err != nil {
		c.t.Fatal(err)
	}
	return l
}

// TestSnapshots runs the snapshot lifecycle on the real Docker engine: accepted in
// Creating, Ready with lastTransitionAt moving; the list's filters and pages; a restore
// with the source's files, entrypoint and policy, the request's env and metadata, and
// neither the source's volume nor execd's token; independence of source and restore;
// snapshots outliving their source; deletion; limits; the error cases of the spec.
func TestSnapshots(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey, Snapshots: lifecycle.SnapshotLimits{MaxPerSandbox: 2}})
	c := newClient(t, h)
	t.Cleanup(func() { // images of snapshots the test left
		out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})

	t.Run("errors", func(t *testing.T) {
		c.want("GET", "/v1/snapshots/nosuch", nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("DELETE", "/v1/snapshots/nosuch", nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("POST", "/v1/sandboxes/nosuch/snapshots", map[string]any{}, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		both := baseReq(h.Image, nil)
		both["snapshotId"] = "snap-x"
		c.want("POST", "/v1/sandboxes", both, http.StatusBadRequest, "INVALID_REQUEST")
		neither := baseReq(h.Image, nil)
		delete(neither, "image")
		c.want("POST", "/v1/sandboxes", neither, http.StatusBadRequest, "INVALID_REQUEST")
		neither["snapshotId"] = "snap-nosuch"
		c.want("POST", "/v1/sandboxes", neither, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
	})

	vol := fmt.Sprintf("altest-snapvol-%d", os.Getpid())
	src := baseReq(h.Image, map[string]string{"role": "source"})
	src["env"] = map[string]string{"FOO": "source", "KEEP": "kept"}
	src["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "example.com"}}}
	src["volumes"] = []any{map[string]any{"name": "data", "mountPath": "/data",
		"pvc": map[string]any{"claimName": vol, "deleteOnSandboxTermination": true}}}
	source := c.create(src)
	c.waitState(source.ID, opensandbox.Running)
	c.run(source.ID, "echo hello > /root/state.txt && echo vol > /data/vol.txt && mkdir -p /srv/app && echo app > /srv/app/file")
	srcPolicy := c.want("GET", "/v1/sandboxes/"+source.ID+"/policy", nil, http.StatusOK, "")

	c.want("POST", "/v1/sandboxes/"+source.ID+"/snapshots", `{"bogus":1}`, http.StatusBadRequest, "INVALID_JSON")
	c.want("POST", "/v1/sandboxes/"+source.ID+"/snapshots", `{"name":""}`, http.StatusBadRequest, "INVALID_REQUEST")
	resp, b := c.do("POST", "/v1/sandboxes/"+source.ID+"/snapshots", map[string]any{"name": "first"})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create snapshot: %d %s", resp.StatusCode, b)
	}
	var acc lifecycle.Snapshot
	if err := json.Unmarshal(b, &acc); err != nil {
		t.Fatal(err)
	}
	if acc.Status.State != "Creating" || acc.Status.Reason != "snapshot_accepted" || acc.Status.Message != "Snapshot creation accepted." ||
		acc.SandboxID != source.ID || acc.Name != "first" || acc.CreatedAt.IsZero() || acc.Status.LastTransitionAt.IsZero() {
		t.Fatalf("accepted snapshot %s", b)
	}
	if loc := resp.Header.Get("Location"); loc != "/v1/snapshots/"+acc.ID {
		t.Errorf("Location %q", loc)
	}
	ready := c.waitSnapshot(acc.ID)
	if ready.Status.State != "Ready" || ready.Status.Reason != "snapshot_ready" || !ready.Status.LastTransitionAt.After(acc.Status.LastTransitionAt) {
		t.Fatalf("snapshot %+v, accepted %+v", ready, acc)
	}
	var sn2 lifecycle.Snapshot
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes/"+source.ID+"/snapshots", "", http.StatusAccepted, ""), &sn2); err != nil {
		t.Fatal(err)
	}
	c.waitSnapshot(sn2.ID)
	c.want("POST", "/v1/sandboxes/"+source.ID+"/snapshots", map[string]any{}, http.StatusConflict, "SNAPSHOT_LIMIT_EXCEEDED")

	t.Run("list", func(t *testing.T) {
		if l := c.listSnapshots("sandboxId=" + source.ID); len(l.Items) != 2 || l.Pagination.TotalItems != 2 || l.Items[0].ID != sn2.ID {
			t.Errorf("by sandbox: %+v", l)
		}
		if l := c.listSnapshots("sandboxId=" + source.ID + "&state=Ready&state=Failed"); len(l.Items) != 2 {
			t.Errorf("Ready|Failed: %+v", l)
		}
		if l := c.listSnapshots("state=Creating"); len(l.Items) != 0 || l.Pagination.TotalPages != 0 || l.Items == nil {
			t.Errorf("Creating: %+v", l)
		}
		if l := c.listSnapshots("sandboxId=nosuch"); len(l.Items) != 0 {
			t.Errorf("unknown sandbox: %+v", l)
		}
		p1 := c.listSnapshots("sandboxId=" + source.ID + "&pageSize=1&page=1")
		p2 := c.listSnapshots("sandboxId=" + source.ID + "&pageSize=1&page=2")
		want1 := lifecycle.Pagination{Page: 1, PageSize: 1, TotalItems: 2, TotalPages: 2, HasNextPage: true}
		want2 := lifecycle.Pagination{Page: 2, PageSize: 1, TotalItems: 2, TotalPages: 2, HasNextPage: false}
		if len(p1.Items) != 1 || len(p2.Items) != 1 || p1.Items[0].ID == p2.Items[0].ID || p1.Pagination != want1 || p2.Pagination != want2 {
			t.Errorf("pages: %+v %+v", p1, p2)
		}
		c.want("GET", "/v1/snapshots?pageSize=0", nil, http.StatusBadRequest, "INVALID_REQUEST")
	})

	restoreReq := map[string]any{
		"snapshotId":     acc.ID,
		"timeout":        600,
		"resourceLimits": map[string]string{"cpu": "1", "memory": "512Mi"},
		"env":            map[string]string{"FOO": "restored"},
		"metadata":       map[string]string{"role": "restored"},
	}
	restored := c.create(restoreReq)
	if restored.ID == source.ID || restored.ExpiresAt == nil || restored.Metadata["role"] != "restored" ||
		strings.Join(restored.Entrypoint, " ") != "tail -f /dev/null" {
		t.Fatalf("restore answered %+v", restored)
	}
	got := c.waitState(restored.ID, opensandbox.Running)
	if got.SnapshotID != acc.ID || got.Image != nil {
		t.Errorf("restored sandbox reports snapshotId %q image %v", got.SnapshotID, got.Image)
	}
	t.Run("restored_state", func(t *testing.T) {
		if out := c.run(restored.ID, "cat /root/state.txt /srv/app/file"); out != "helloapp" {
			t.Errorf("files in the restore: %q", out)
		}
		if out := c.run(restored.ID, "echo $FOO $KEEP"); out != "restored kept" {
			t.Errorf("env in the restore: %q (request env overrides, the snapshot's stays)", out)
		}
		if out := c.run(restored.ID, "ls /data/vol.txt 2>&1; ls -A /opt/airlock/run/ 2>/dev/null | wc -l"); !strings.Contains(out, "No such file") || !strings.HasSuffix(out, "0") {
			t.Errorf("the source's volume file or execd's token came along: %q", out)
		}
		var a, b struct {
			Policy json.RawMessage `json:"policy"`
		}
		_ = json.Unmarshal(srcPolicy, &a)
		_ = json.Unmarshal(c.want("GET", "/v1/sandboxes/"+restored.ID+"/policy", nil, http.StatusOK, ""), &b)
		if len(a.Policy) < 10 || string(a.Policy) != string(b.Policy) {
			t.Errorf("policy of the restore %s, of the source %s", b.Policy, a.Policy)
		}
	})

	t.Run("independence", func(t *testing.T) {
		c.run(restored.ID, "echo changed > /root/state.txt")
		if out := c.run(source.ID, "cat /root/state.txt"); out != "hello" {
			t.Errorf("a write in the restore reached the source: %q", out)
		}
		c.want("DELETE", "/v1/sandboxes/"+source.ID, nil, http.StatusNoContent, "")
		if out := c.run(restored.ID, "cat /root/state.txt /srv/app/file"); out != "changedapp" {
			t.Errorf("restore after the source's delete: %q", out)
		}
		if l := c.listSnapshots("sandboxId=" + source.ID); len(l.Items) != 2 {
			t.Errorf("snapshots after their source's delete: %+v", l)
		}
		again := c.create(restoreReq) // a second restore of the same snapshot, source gone
		c.waitState(again.ID, opensandbox.Running)
		if out := c.run(again.ID, "cat /root/state.txt"); out != "hello" {
			t.Errorf("second restore reads %q", out)
		}
		c.want("DELETE", "/v1/sandboxes/"+again.ID, nil, http.StatusNoContent, "")
	})

	t.Run("fork", func(t *testing.T) {
		bad := maps.Clone(restoreReq)
		bad["extensions"] = map[string]string{lifecycle.ExtCount: "0"}
		c.want("POST", "/v1/sandboxes", bad, http.StatusBadRequest, "INVALID_REQUEST")
		noSnap := baseReq(h.Image, nil)
		noSnap["extensions"] = map[string]string{lifecycle.ExtCount: "2"}
		c.want("POST", "/v1/sandboxes", noSnap, http.StatusBadRequest, "INVALID_REQUEST")
		fork := maps.Clone(restoreReq)
		fork["extensions"] = map[string]string{lifecycle.ExtCount: "3"}
		resp, b := c.do("POST", "/v1/sandboxes", fork)
		var fr lifecycle.ForkResponse
		if err := json.Unmarshal(b, &fr); err != nil || resp.StatusCode != http.StatusAccepted || len(fr.Items) != 3 || fr.ID != fr.Items[0].ID {
			t.Fatalf("fork: %d %s", resp.StatusCode, b)
		}
		seen := map[string]bool{}
		for _, sb := range fr.Items {
			seen[sb.ID] = true
			c.waitState(sb.ID, opensandbox.Running)
			if out := c.run(sb.ID, "cat /root/state.txt; echo $FOO"); out != "hellorestored" {
				t.Errorf("fork %s reads %q", sb.ID, out)
			}
			if got := c.get(sb.ID); got.SnapshotID != acc.ID {
				t.Errorf("fork %s reports snapshotId %q", sb.ID, got.SnapshotID)
			}
		}
		c.run(fr.Items[0].ID, "echo mine > /root/state.txt")
		if out := c.run(fr.Items[1].ID, "cat /root/state.txt"); out != "hello" || len(seen) != 3 {
			t.Errorf("forks share files or ids: %q %v", out, seen)
		}
		for id := range seen {
			c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
		}
	})

	t.Run("delete", func(t *testing.T) {
		c.want("DELETE", "/v1/snapshots/"+acc.ID, nil, http.StatusNoContent, "")
		c.want("GET", "/v1/snapshots/"+acc.ID, nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("DELETE", "/v1/snapshots/"+acc.ID, nil, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		c.want("POST", "/v1/sandboxes", restoreReq, http.StatusNotFound, "SNAPSHOT_NOT_FOUND")
		if out := c.run(restored.ID, "cat /srv/app/file"); out != "app" {
			t.Errorf("restore after its snapshot's delete: %q", out)
		}
		if out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot="+acc.ID).Output(); len(strings.TrimSpace(string(out))) != 0 {
			// the restore still uses the layers, but nothing is tagged for the snapshot
			tags, _ := exec.Command("docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "label=airlock.dev/snapshot="+acc.ID).Output()
			if strings.Contains(string(tags), "airlock/snapshot:") {
				t.Errorf("snapshot image still tagged after delete: %s", tags)
			}
		}
		c.want("DELETE", "/v1/snapshots/"+sn2.ID, nil, http.StatusNoContent, "")
	})

	t.Run("paused_source", func(t *testing.T) {
		c.want("POST", "/v1/sandboxes/"+restored.ID+"/pause", nil, http.StatusAccepted, "")
		c.want("POST", "/v1/sandboxes/"+restored.ID+"/snapshots", map[string]any{}, http.StatusConflict, "INVALID_STATE")
		c.want("DELETE", "/v1/sandboxes/"+restored.ID, nil, http.StatusNoContent, "")
	})
}

// TestSnapshotVault: a credential-proxy sandbox's snapshot leaves its interception CA
// out of the image (the trust store is the image's own again), its vault's bindings are
// re-bound to the restored sandbox (which trusts its own CA, not the source's), and the
// secret appears nowhere in the API's answers.
func TestSnapshotVault(t *testing.T) {
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := lctest.New(t, lctest.Options{APIKey: testKey, CredentialVault: store})
	c := newClient(t, h)
	const secret = "snapshot-vault-SECRET-1"
	req := baseReq(h.Image, nil)
	req["credentialProxy"] = map[string]any{"enabled": true}
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "api.example.com"}}}
	src := c.create(req)
	c.waitState(src.ID, opensandbox.Running)
	c.want("POST", "/v1/sandboxes/"+src.ID+"/proxy/18080/credential-vault", map[string]any{
		"credentials": []any{map[string]any{"name": "key", "source": map[string]any{"type": "inline", "value": secret}}},
		"bindings": []any{map[string]any{"name": "api", "match": map[string]any{"hosts": []string{"api.example.com"}},
			"auth": map[string]any{"type": "bearer", "credential": "key"}}},
	}, http.StatusCreated, "")
	_, _, srcCA, err := store.CA(src.ID)
	if err != nil {
		t.Fatal(err)
	}
	firstLine := func(pem []byte) string { return strings.Split(strings.TrimSpace(string(pem)), "\n")[1] }
	var sn lifecycle.Snapshot
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes/"+src.ID+"/snapshots", "{}", http.StatusAccepted, ""), &sn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", "airlock/snapshot:"+strings.ToLower(sn.ID)).Run() })
	if got := c.waitSnapshot(sn.ID); got.Status.State != lifecycle.SnapshotReady {
		t.Fatalf("snapshot %+v", got)
	}
	bundle, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "cat",
		"airlock/snapshot:"+strings.ToLower(sn.ID), "/etc/ssl/certs/ca-certificates.crt").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(bundle), firstLine(srcCA)) {
		t.Error("the snapshot image trusts the source sandbox's interception CA")
	}
	restored := c.create(map[string]any{"snapshotId": sn.ID, "timeout": 600})
	c.waitState(restored.ID, opensandbox.Running)
	state := string(c.want("GET", "/v1/sandboxes/"+restored.ID+"/proxy/18080/credential-vault", nil, http.StatusOK, ""))
	if !strings.Contains(state, `"api"`) || !strings.Contains(state, `"key"`) || strings.Contains(state, secret) {
		t.Errorf("restored vault: %s", state)
	}
	_, _, ownCA, err := store.CA(restored.ID)
	if err != nil {
		t.Fatal(err)
	}
	trust := c.run(restored.ID, "cat $SSL_CERT_FILE")
	if !strings.Contains(trust, firstLine(ownCA)) || strings.Contains(trust, firstLine(srcCA)) {
		t.Error("the restored sandbox does not trust its own CA only")
	}
	if inj, ok := store.Match(restored.ID, vault.Request{Scheme: "https", Host: "api.example.com", Port: 443, Method: "GET", Path: "/"}); !ok || inj.Binding != "api" {
		t.Errorf("the restored sandbox's binding does not inject: %v %+v", ok, inj)
	}
	c.want("DELETE", "/v1/sandboxes/"+restored.ID, nil, http.StatusNoContent, "")
	c.want("DELETE", "/v1/snapshots/"+sn.ID, nil, http.StatusNoContent, "")
	if store.Intercepts(sn.ID, "https", "api.example.com", 443) {
		t.Error("the snapshot's vault copy outlives the snapshot")
	}
}
