package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestSnapshotThroughNode: Snapshot asks the egressd of the pod's node (its hostIP, the
// configured port, the API key) to commit the pod's sandbox container, by its
// containerd id, into SnapshotRef(node, id), leaving the trust variables out when the
// sandbox trusted extra CAs; a create from that reference is bound to the node and never
// pulls; RemoveSnapshot asks the egressd pod of that node to remove the image. Without
// Config.Snapshots the runtime cannot snapshot (501).
func TestSnapshotThroughNode(t *testing.T) {
	var mu sync.Mutex
	var commits []watch.SnapshotCommit
	var removes []watch.SnapshotRemove
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(opensandbox.HeaderAPIKey) != "node-key" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case watch.SnapshotPath + "remove":
			var req watch.SnapshotRemove
			_ = json.NewDecoder(r.Body).Decode(&req)
			removes = append(removes, req)
			w.WriteHeader(http.StatusNoContent)
		case watch.SnapshotPath + "abc":
			var req watch.SnapshotCommit
			_ = json.NewDecoder(r.Body).Decode(&req)
			commits = append(commits, req)
			opensandbox.WriteJSON(w, http.StatusOK, watch.SnapshotCommitted{Ref: req.Ref, Digest: "sha256:1", Bytes: 4096})
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer node.Close()
	_, portStr, _ := net.SplitHostPort(node.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	ctx := context.Background()
	cs := fake.NewClientset(
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: kube.PodName("abc"), Namespace: "sbx"},
			Spec:       corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1", ContainerStatuses: []corev1.ContainerStatus{
				{Name: kube.ContainerName, ContainerID: "containerd://c0ffee"},
			}},
		},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "egressd-x", Namespace: "airlock-system", Labels: map[string]string{"app.kubernetes.io/name": "airlock-egressd"}},
			Spec:       corev1.PodSpec{NodeName: "node-a"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1"},
		},
	)
	off, err := kube.New(kube.Config{Client: cs, Namespace: "sbx", Instance: "i"})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.CanSnapshot(); !errors.Is(err, lifecycle.ErrNotImplemented) {
		t.Fatalf("CanSnapshot without Snapshots: %v, want ErrNotImplemented", err)
	}
	rt, err := kube.New(kube.Config{Client: cs, Namespace: "sbx", Instance: "i",
		Snapshots: &kube.SnapshotConfig{EgressdPort: port, APIKey: "node-key"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.CanSnapshot(); err != nil {
		t.Fatal(err)
	}
	art, err := rt.Snapshot(ctx, lifecycle.Instance{SandboxID: "abc", ContainerID: kube.PodName("abc")}, "snap-X1", true)
	if err != nil {
		t.Fatal(err)
	}
	want := kube.SnapshotRef("node-a", "snap-X1")
	if art.Ref != want || art.Ref != watch.SnapshotRefPrefix+"node-a:snap-x1" || art.Bytes != 4096 {
		t.Fatalf("artifact %+v, want ref %s, 4096 bytes", art, want)
	}
	if len(commits) != 1 {
		t.Fatalf("commits on the node: %+v", commits)
	}
	if c := commits[0]; c.ContainerID != "c0ffee" || c.Pod != kube.PodName("abc") || c.Namespace != "sbx" || c.Container != kube.ContainerName ||
		c.SnapshotID != "snap-X1" || !slices.Contains(c.DropEnv, "GIT_SSL_CAINFO") || len(c.DropEnv) != 4 {
		t.Errorf("commit request %+v", c)
	}

	// A restore: bound to the node, never pulled.
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "def", Image: art.Ref, Entrypoint: []string{"sh"}, TrustedCAPEM: []byte("pem")})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("sbx").Get(ctx, inst.ContainerID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchFields[0].Key != "metadata.name" || terms[0].MatchFields[0].Values[0] != "node-a" {
		t.Errorf("the restore's node affinity %+v, want metadata.name in [node-a]", terms)
	}
	if p := pod.Spec.Containers[0].ImagePullPolicy; p != corev1.PullNever {
		t.Errorf("the restore's sandbox container pulls %q, want Never", p)
	}
	for _, ic := range pod.Spec.InitContainers {
		if ic.Image == art.Ref && ic.ImagePullPolicy != corev1.PullNever {
			t.Errorf("init container %s of the snapshot image pulls %q, want Never", ic.Name, ic.ImagePullPolicy)
		}
	}
	if err := rt.RemoveSnapshot(ctx, art.Ref); err != nil {
		t.Fatal(err)
	}
	if len(removes) != 1 || removes[0].Ref != art.Ref {
		t.Errorf("removes on the node: %+v, want %s", removes, art.Ref)
	}
	if err := rt.RemoveSnapshot(ctx, "airlock/sandbox:1"); err == nil {
		t.Error("RemoveSnapshot of an image that is no snapshot: no error")
	}
}
