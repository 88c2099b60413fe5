package kubenode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// TestSnapshotOnNode takes a snapshot of a sandbox on the real node and restores it:
// Airlock deployed by `make kube-up`'s scripts (its egressd DaemonSet with
// --containerd-socket on the node's private containerd, lifecycle with --snapshots),
// a sandbox under a deny-all policy but one name writes a file; POST
// /sandboxes/{id}/snapshots answers Creating and the snapshot turns Ready (the node's
// egressd committed the pod's container into an image in containerd's k8s.io
// namespace, which ctr lists); a restore by snapshotId (no policy in the request) runs
// on that node with imagePullPolicy Never, has the file, reports the snapshotId, and
// its entrypoint's first connection, to an address the policy does not allow, was
// already refused with EPERM (the snapshot's policy enforced before the entrypoint);
// deleting the snapshot answers 204, then 404, and the image is gone from the node.
func TestSnapshotOnNode(t *testing.T) {
	n, a, c := deployed(t, 60)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := n.Namespace(t, "snap")
	allowedName := dnsName(t, n, ns, "allowed", "198.51.100.7")
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, allowedName)
	res := map[string]string{"cpu": "250m", "memory": "256Mi"}

	src, err := c.Create(ctx, sdk.CreateRequest{Image: nodeSandboxImage, Timeout: 10 * time.Minute, Resources: res,
		NetworkPolicy: json.RawMessage(policy), Env: map[string]string{"FOO": "source", "KEEP": "kept"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), src.ID) })
	run := waitExecd(ctx, t, c, src.ID)
	if got := run("mkdir -p /srv/work && echo written-before-the-snapshot > /srv/work/notes.txt && cat /srv/work/notes.txt"); got != "written-before-the-snapshot" {
		t.Fatalf("writing the file: %q", got)
	}

	// The snapshot: accepted as Creating, then Ready.
	var acc struct {
		ID        string `json:"id"`
		SandboxID string `json:"sandboxId"`
		Status    struct {
			State, Reason, Message string
			LastTransitionAt       time.Time
		} `json:"status"`
	}
	began := time.Now()
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]string{"name": "first"}, &acc); code != http.StatusAccepted {
		t.Fatalf("POST snapshots: HTTP %d, want 202", code)
	}
	if acc.Status.State != "Creating" || acc.Status.Reason != "snapshot_accepted" || acc.SandboxID != src.ID {
		t.Fatalf("accepted snapshot %+v, want Creating, snapshot_accepted, of %s", acc, src.ID)
	}
	snap := acc
	n.Wait(t, "the snapshot to leave Creating", 5*time.Minute, func() (bool, error) {
		if code := apiCall(ctx, t, a, http.MethodGet, "/snapshots/"+acc.ID, nil, &snap); code != http.StatusOK {
			return false, fmt.Errorf("GET snapshot: HTTP %d", code)
		}
		return snap.Status.State != "Creating", nil
	})
	if snap.Status.State != "Ready" {
		t.Fatalf("snapshot %s is %s (%s: %s), want Ready", snap.ID, snap.Status.State, snap.Status.Reason, snap.Status.Message)
	}
	t.Logf("snapshot %s Ready in %s", snap.ID, time.Since(began).Round(100*time.Millisecond))
	if !snap.Status.LastTransitionAt.After(acc.Status.LastTransitionAt) {
		t.Errorf("lastTransitionAt did not move forward: %s then %s", acc.Status.LastTransitionAt, snap.Status.LastTransitionAt)
	}
	ref := kube.SnapshotRef(NodeName, snap.ID)
	if out := n.ctr(t, "images", "ls", "-q"); !strings.Contains(out, ref) {
		t.Fatalf("the node's containerd has no image %s:\n%s", ref, out)
	}

	// The restore: its own id, the snapshot's files and policy, on the snapshot's node.
	d, dport := "198.51.100.9", "443"
	first := fmt.Sprintf(`(timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>&1; echo rc=$?) >/tmp/first-connect; exec tail -f /dev/null`, d, dport)
	var restored struct {
		ID string `json:"id"`
	}
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes", map[string]any{
		"snapshotId": snap.ID, "timeout": 600, "resourceLimits": res, "entrypoint": []string{"bash", "-c", first},
		"env": map[string]string{"FOO": "restored"}, "metadata": map[string]string{"role": "restored"},
	}, &restored); code != http.StatusAccepted {
		t.Fatalf("restore: HTTP %d, want 202", code)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), restored.ID) })
	if restored.ID == src.ID || restored.ID == "" {
		t.Fatalf("restored sandbox id %q (source %s)", restored.ID, src.ID)
	}
	rrun := waitExecd(ctx, t, c, restored.ID)
	if got := rrun("cat /srv/work/notes.txt"); got != "written-before-the-snapshot" {
		t.Errorf("the restored sandbox's /srv/work/notes.txt is %q, want the source's", got)
	}
	if got := rrun("echo $FOO $KEEP"); got != "restored kept" {
		t.Errorf("the restored sandbox's env FOO KEEP is %q, want \"restored kept\" (the request's over the snapshot's)", got)
	}
	if got := rrun("for i in $(seq 50); do [ -s /tmp/first-connect ] && break; sleep 0.2; done; cat /tmp/first-connect"); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("the restored entrypoint's first connection to %s:%s gave %q, want EPERM (the snapshot's policy enforced before the entrypoint)", d, dport, got)
	}
	if got := rrun("getent hosts " + allowedName + " || echo unresolved"); !strings.HasPrefix(got, "198.51.100.7 ") {
		t.Errorf("the allowed name %s resolves to %q in the restored sandbox, want 198.51.100.7", allowedName, got)
	}
	var info struct {
		SnapshotID string `json:"snapshotId"`
	}
	if code := apiCall(ctx, t, a, http.MethodGet, "/sandboxes/"+restored.ID, nil, &info); code != http.StatusOK || info.SnapshotID != snap.ID {
		t.Errorf("GET the restored sandbox: HTTP %d, snapshotId %q, want %s", code, info.SnapshotID, snap.ID)
	}
	pod, err := n.Client.CoreV1().Pods("airlock-sandboxes").Get(ctx, kube.PodName(restored.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ctr := pod.Spec.Containers[0]; ctr.Image != ref || ctr.ImagePullPolicy != corev1.PullNever || pod.Spec.Affinity == nil {
		t.Errorf("the restored pod runs %s (pull %s, affinity %v), want %s, Never, bound to its node", ctr.Image, ctr.ImagePullPolicy, pod.Spec.Affinity, ref)
	}
	// Source and restore do not share writes.
	rrun("echo changed > /srv/work/notes.txt")
	if got := run("cat /srv/work/notes.txt"); got != "written-before-the-snapshot" {
		t.Errorf("the source's file is %q after the restore wrote its own", got)
	}

	// Delete: 204, then 404, and the image leaves the node.
	if code := apiCall(ctx, t, a, http.MethodDelete, "/snapshots/"+snap.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE snapshot: HTTP %d, want 204", code)
	}
	if code := apiCall(ctx, t, a, http.MethodGet, "/snapshots/"+snap.ID, nil, nil); code != http.StatusNotFound {
		t.Errorf("GET a deleted snapshot: HTTP %d, want 404", code)
	}
	if out := n.ctr(t, "images", "ls", "-q"); strings.Contains(out, ref) {
		t.Errorf("the node's containerd still has image %s after the delete", ref)
	}
	if got := rrun("cat /srv/work/notes.txt"); got != "changed" {
		t.Errorf("the restored sandbox after the snapshot's delete reads %q", got)
	}
}

// waitExecd waits until sandbox id runs and execd answers, and returns a function that
// runs a command there and gives its stdout (lines joined by spaces).
func waitExecd(ctx context.Context, t *testing.T, c *sdk.Client, id string) func(string) string {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.WaitState(wctx, id, opensandbox.Running, 250*time.Millisecond); err != nil {
		t.Fatalf("sandbox %s not Running: %v", id, err)
	}
	x, err := c.Execd(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return func(command string) string {
		ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
		if err != nil {
			t.Fatalf("running %q in %s: %v", command, id, err)
		}
		return strings.Join(ex.Stdout, " ")
	}
}

// apiCall sends one request to the lifecycle API (/v1+path) with the API key and
// decodes a 2xx JSON answer into out; it returns the status code.
func apiCall(ctx context.Context, t *testing.T, a Airlock, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.API+"/v1"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(opensandbox.HeaderAPIKey, a.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Logf("%s %s: HTTP %d %s", method, path, resp.StatusCode, raw)
	} else if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return resp.StatusCode
}

// ctr runs ctr against the node's private containerd, namespace k8s.io.
func (n *Node) ctr(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ctr", append([]string{"--address", RunDir + "/containerd/containerd.sock", "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %v: %v\n%s", args, err, out)
	}
	return string(out)
}
