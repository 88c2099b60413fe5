package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// TestPauseOnNode pauses and resumes a sandbox on the real node (Airlock deployed by
// `make kube-up`'s scripts, lifecycle with --snapshots): a sandbox under a deny-all
// policy but one name writes a file; POST pause answers 202 once Paused, its pod is
// gone, the node's containerd holds its pause image (kube.PauseRef), GET says Paused;
// a PUT of its policy while paused (a second name allowed) answers 200; POST resume
// answers once it runs again with the same id, the file there, the denied address
// still refused with EPERM, both allowed names reached through the data plane (no
// EPERM); the delete removes the pause image from the node. A resume whose
// NetworkPolicy went missing ends Failed with no pod; a paused sandbox expires.
func TestPauseOnNode(t *testing.T) {
	n, a, c := deployed(t, 60)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := n.Namespace(t, "pause")
	first := dnsName(t, n, ns, "first", "198.51.100.7")
	second := dnsName(t, n, ns, "second", "198.51.100.8")
	policy := func(names ...string) json.RawMessage {
		var rules []string
		for _, nm := range names {
			rules = append(rules, fmt.Sprintf(`{"action":"allow","target":%q}`, nm))
		}
		return json.RawMessage(`{"defaultAction":"deny","egress":[` + strings.Join(rules, ",") + `]}`)
	}
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: nodeSandboxImage, Timeout: 10 * time.Minute,
		Resources: map[string]string{"cpu": "250m", "memory": "256Mi"}, NetworkPolicy: policy(first)})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sb.ID) })
	run := waitExecd(ctx, t, c, sb.ID)
	if got := run("mkdir -p /srv/work && echo written-before-the-pause > /srv/work/notes.txt && cat /srv/work/notes.txt"); got != "written-before-the-pause" {
		t.Fatalf("writing the file: %q", got)
	}
	// connect tries a TCP connection for at most 2 s and says how it ended.
	connect := func(run func(string) string, host string) string {
		return run(fmt.Sprintf(`timeout 2 bash -c 'exec 3<>/dev/tcp/%s/443' 2>&1; echo rc=$?`, host))
	}
	const denied = "198.51.100.9"
	if got := connect(run, denied); !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("before the pause, a connection to %s gave %q, want EPERM", denied, got)
	}
	pods := n.Client.CoreV1().Pods("airlock-sandboxes")
	before, err := pods.Get(ctx, kube.PodName(sb.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+sb.ID+"/pause", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST pause: HTTP %d, want 202", code)
	}
	pauseTook := time.Since(began)
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.Status.State != opensandbox.Paused {
		t.Fatalf("after the pause: %+v, %v; want Paused", got.Status, err)
	}
	if _, err := pods.Get(ctx, kube.PodName(sb.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the paused sandbox's pod: %v, want it gone", err)
	}
	ref := kube.PauseRef(NodeName, sb.ID)
	if out := n.ctr(t, "images", "ls", "-q"); !strings.Contains(out, ref) {
		t.Fatalf("the node's containerd has no pause image %s:\n%s", ref, out)
	}
	if l, err := c.List(ctx, sdk.ListOptions{States: []string{string(opensandbox.Paused)}}); err != nil || len(l.Items) != 1 || l.Items[0].ID != sb.ID {
		t.Errorf("List Paused: %+v, %v; want the sandbox", l, err)
	}
	if code := apiCall(ctx, t, a, http.MethodPut, "/sandboxes/"+sb.ID+"/policy", policy(first, second), nil); code != http.StatusOK {
		t.Errorf("PUT the policy of a paused sandbox: HTTP %d, want 200", code)
	}
	time.Sleep(3 * time.Second) // a resync or two must not mark it vanished
	if got, err := c.Get(ctx, sb.ID); err != nil || got.Status.State != opensandbox.Paused {
		t.Fatalf("a while after the pause: %+v, %v; want Paused", got.Status, err)
	}

	began = time.Now()
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+sb.ID+"/resume", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST resume: HTTP %d, want 202", code)
	}
	resumeTook := time.Since(began)
	t.Logf("pause took %s, resume (to Running) %s", pauseTook.Round(10*time.Millisecond), resumeTook.Round(10*time.Millisecond))
	if got, err := c.Get(ctx, sb.ID); err != nil || got.Status.State != opensandbox.Running {
		t.Fatalf("after the resume: %+v, %v; want Running", got.Status, err)
	}
	after, err := pods.Get(ctx, kube.PodName(sb.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID == before.UID || after.Spec.Containers[0].Image != ref || after.Labels[kube.LabelSandboxID] != sb.ID {
		t.Errorf("the resumed pod: uid %s (was %s), image %s, sandbox %s; want a new pod of %s from %s",
			after.UID, before.UID, after.Spec.Containers[0].Image, after.Labels[kube.LabelSandboxID], sb.ID, ref)
	}
	rrun := waitExecd(ctx, t, c, sb.ID)
	if got := rrun("cat /srv/work/notes.txt"); got != "written-before-the-pause" {
		t.Errorf("after the resume /srv/work/notes.txt is %q, want the file written before the pause", got)
	}
	if got := connect(rrun, denied); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("after the resume, a connection to %s gave %q, want EPERM (the policy enforced)", denied, got)
	}
	for _, name := range []string{first, second} {
		if got := connect(rrun, name); strings.Contains(got, "Operation not permitted") {
			t.Errorf("after the resume, a connection to the allowed %s gave %q, want no EPERM", name, got)
		}
	}

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if out := n.ctr(t, "images", "ls", "-q"); strings.Contains(out, ref) {
		t.Errorf("the node's containerd still has the pause image %s after the delete", ref)
	}
	if _, err := n.Client.CoreV1().Secrets("airlock-sandboxes").Get(ctx, kube.PauseSecretName(sb.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pause record after the delete: %v, want gone", err)
	}

	// A resume that cannot keep the second layer fails: with the NetworkPolicy deleted
	// while paused, resume answers an error, the sandbox is Failed (resume_failed), no
	// pod runs; the delete still removes the pause image.
	t.Run("failed-resume", func(t *testing.T) {
		id := pausedSandbox(ctx, t, n, a, c, policy(first))
		if err := n.Client.NetworkingV1().NetworkPolicies("airlock-sandboxes").Delete(ctx, kube.PodName(id), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+id+"/resume", nil, nil); code/100 == 2 {
			t.Errorf("POST resume without the NetworkPolicy: HTTP %d, want an error", code)
		}
		if got, err := c.Get(ctx, id); err != nil || got.Status.State != opensandbox.Failed || got.Status.Reason != "resume_failed" || got.Status.Message == "" {
			t.Errorf("after the failed resume: %+v, %v; want Failed, resume_failed, a message", got.Status, err)
		}
		if _, err := pods.Get(ctx, kube.PodName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the pod after a failed resume: %v, want none", err)
		}
		if err := c.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		if out := n.ctr(t, "images", "ls", "-q"); strings.Contains(out, kube.PauseRef(NodeName, id)) {
			t.Errorf("the pause image of the failed sandbox is still on the node after its delete")
		}
	})

	// Expiry applies while paused: the reaper deletes the sandbox and its pause image.
	t.Run("expiry", func(t *testing.T) {
		id := pausedSandbox(ctx, t, n, a, c, policy(first))
		if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+id+"/renew-expiration",
			map[string]any{"expiresAt": time.Now().Add(3 * time.Second)}, nil); code != http.StatusOK {
			t.Fatalf("renew-expiration: HTTP %d", code)
		}
		n.Wait(t, "the paused sandbox to expire", 2*time.Minute, func() (bool, error) {
			return apiCall(ctx, t, a, http.MethodGet, "/sandboxes/"+id, nil, nil) == http.StatusNotFound, nil
		})
		if out := n.ctr(t, "images", "ls", "-q"); strings.Contains(out, kube.PauseRef(NodeName, id)) {
			t.Errorf("the pause image of the expired sandbox is still on the node")
		}
	})
}

// pausedSandbox creates a sandbox under policy, waits until it runs, pauses it and
// returns its id once Paused; it is deleted when t ends.
func pausedSandbox(ctx context.Context, t *testing.T, n *Node, a Airlock, c *sdk.Client, policy json.RawMessage) string {
	t.Helper()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: nodeSandboxImage, Timeout: 10 * time.Minute,
		Resources: map[string]string{"cpu": "250m", "memory": "256Mi"}, NetworkPolicy: policy})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sb.ID) })
	waitExecd(ctx, t, c, sb.ID)
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+sb.ID+"/pause", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST pause: HTTP %d, want 202", code)
	}
	if out := n.ctr(t, "images", "ls", "-q"); !strings.Contains(out, kube.PauseRef(NodeName, sb.ID)) {
		t.Fatalf("no pause image of %s on the node", sb.ID)
	}
	return sb.ID
}
