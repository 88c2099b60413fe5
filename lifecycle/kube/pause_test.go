package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestPauseResumeThroughNode: Pause has the node's egressd commit the pod's container
// into PauseRef(node, id) (no trust variables dropped: the pod states its env), keeps
// the pod in a pause record, releases the NetworkPolicy and execd token Secret from the
// pod and deletes it; Inspect and List then report the sandbox paused on its node.
// Resume refuses without the NetworkPolicy (no pod made), then makes the pod again
// under the same name and sandbox id from the pause image,
// unscheduled but bound to that node, never pulled, with the rest of its spec as it
// was, and gives the NetworkPolicy and Secret back to it; Resumed stops reporting it
// paused; Remove takes the pause image and record away.
func TestPauseResumeThroughNode(t *testing.T) {
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
		if r.URL.Path == watch.SnapshotPath+"remove" {
			var req watch.SnapshotRemove
			_ = json.NewDecoder(r.Body).Decode(&req)
			removes = append(removes, req)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		var req watch.SnapshotCommit
		_ = json.NewDecoder(r.Body).Decode(&req)
		commits = append(commits, req)
		opensandbox.WriteJSON(w, http.StatusOK, watch.SnapshotCommitted{Ref: req.Ref, Digest: "sha256:1", Bytes: 4096})
	}))
	defer node.Close()
	_, portStr, _ := net.SplitHostPort(node.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	const id, nodeName = "abc", "node-a"
	name := kube.PodName(id)
	labels := map[string]string{kube.LabelSandboxID: id, kube.LabelInstance: "i", kube.LabelManagedBy: "airlock"}
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: "uid-1"}}
	cs := fake.NewClientset(
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", UID: "uid-1", Labels: labels,
				Annotations: map[string]string{kube.AnnotationEntrypoint: `["tail"]`}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: kube.ContainerName, Image: "airlock/sandbox:1",
				Command: []string{kube.ExecdPath, "--hold", "--", "tail"}, Env: []corev1.EnvVar{{Name: "FOO", Value: "bar"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1", PodIP: "10.1.0.5",
				ContainerStatuses: []corev1.ContainerStatus{{Name: kube.ContainerName, ContainerID: "containerd://c0ffee"}}},
		},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", Labels: labels, OwnerReferences: owner}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kube.ExecdTokenSecretName(id), Namespace: "sbx", Labels: labels, OwnerReferences: owner}},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "egressd-x", Namespace: "airlock-system", Labels: map[string]string{"app.kubernetes.io/name": "airlock-egressd"}},
			Spec:       corev1.PodSpec{NodeName: nodeName},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1"},
		},
	)
	off, err := kube.New(kube.Config{Client: cs, Namespace: "sbx", Instance: "i"})
	if err != nil {
		t.Fatal(err)
	}
	var rp lifecycle.RecreatingPauser = off
	if err := rp.Pause(t.Context(), name); !errors.Is(err, kube.ErrPauseUnavailable) {
		t.Fatalf("Pause without snapshots: %v, want ErrPauseUnavailable", err)
	}
	rt, err := kube.New(kube.Config{Client: cs, Namespace: "sbx", Instance: "i",
		Snapshots: &kube.SnapshotConfig{EgressdPort: port, APIKey: "node-key"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.CanPause(); err != nil {
		t.Fatalf("CanPause with snapshots: %v", err)
	}
	ctx := context.Background()
	ref := kube.PauseRef(nodeName, id)
	if ref != watch.SnapshotRefPrefix+"node-a:pause-abc" {
		t.Errorf("PauseRef = %q", ref)
	}

	if err := rt.Pause(ctx, name); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if len(commits) != 1 || commits[0].Ref != ref || commits[0].ContainerID != "c0ffee" || commits[0].Pod != name || len(commits[0].DropEnv) != 0 {
		t.Fatalf("commits %+v, want one of c0ffee into %s keeping its env", commits, ref)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the paused pod: %v, want deleted", err)
	}
	np, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(np.OwnerReferences) != 0 {
		t.Errorf("the paused sandbox's NetworkPolicy: %v, owners %v; want kept, owned by nothing", err, np.OwnerReferences)
	}
	tok, err := cs.CoreV1().Secrets("sbx").Get(ctx, kube.ExecdTokenSecretName(id), metav1.GetOptions{})
	if err != nil || len(tok.OwnerReferences) != 0 {
		t.Errorf("the paused sandbox's execd token Secret: %v, owners %v; want kept, owned by nothing", err, tok.OwnerReferences)
	}
	in, err := rt.Inspect(ctx, name)
	if err != nil || in.Phase != lifecycle.PhasePaused || in.SandboxID != id || in.Node != nodeName || in.Address.IsValid() {
		t.Errorf("Inspect of the paused sandbox: %+v, %v; want paused on %s, no address", in, err, nodeName)
	}
	// No pod to list: lifecycle asks Inspect about a Paused sandbox List leaves out.
	list, err := rt.List(ctx)
	if err != nil || len(list) != 0 {
		t.Errorf("List while paused: %+v, %v; want no instance", list, err)
	}
	if err := rt.Resumed(ctx, lifecycle.Instance{SandboxID: "other"}); err == nil {
		t.Error("Resumed of a sandbox never paused: no error")
	}

	np.OwnerReferences = nil
	if err := cs.NetworkingV1().NetworkPolicies("sbx").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, name); err == nil {
		t.Fatal("Resume without the NetworkPolicy: no error")
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a pod after a resume without the NetworkPolicy: %v", err)
	}
	np.ResourceVersion = ""
	if _, err := cs.NetworkingV1().NetworkPolicies("sbx").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, name); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	pod, err := cs.CoreV1().Pods("sbx").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if c.Image != ref || c.ImagePullPolicy != corev1.PullNever || pod.Spec.NodeName != "" || pod.Labels[kube.LabelSandboxID] != id ||
		pod.Annotations[kube.AnnotationEntrypoint] != `["tail"]` || len(c.Env) != 1 || c.Env[0].Value != "bar" || c.Command[1] != "--hold" {
		t.Errorf("the resumed pod: %+v", pod)
	}
	aff := pod.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0] != nodeName {
		t.Errorf("the resumed pod is not bound to %s: %+v", nodeName, aff)
	}
	np, _ = cs.NetworkingV1().NetworkPolicies("sbx").Get(ctx, name, metav1.GetOptions{})
	tok, _ = cs.CoreV1().Secrets("sbx").Get(ctx, kube.ExecdTokenSecretName(id), metav1.GetOptions{})
	if len(np.OwnerReferences) != 1 || np.OwnerReferences[0].Name != name || len(tok.OwnerReferences) != 1 {
		t.Errorf("after the resume the NetworkPolicy is owned by %v, the token Secret by %v; want the new pod", np.OwnerReferences, tok.OwnerReferences)
	}
	if err := rt.Resumed(ctx, lifecycle.Instance{SandboxID: id, ContainerID: name}); err != nil {
		t.Fatalf("Resumed: %v", err)
	}
	if err := rt.Resume(ctx, name); err == nil {
		t.Error("Resume of a sandbox no longer paused: no error")
	}
	// The pod vanishing now is the sandbox vanishing, not a pause.
	if err := cs.CoreV1().Pods("sbx").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if in, err := rt.Inspect(ctx, name); !errors.Is(err, lifecycle.ErrInstanceGone) {
		t.Errorf("Inspect of a resumed sandbox whose pod is gone: %+v, %v; want ErrInstanceGone", in, err)
	}
	if list, err := rt.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List of a resumed sandbox whose pod is gone: %+v, %v; want nothing", list, err)
	}

	if err := rt.Remove(ctx, lifecycle.Instance{SandboxID: id, ContainerID: name}); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if len(removes) != 1 || removes[0].Ref != ref {
		t.Errorf("removes %+v, want the pause image %s", removes, ref)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(ctx, kube.PauseSecretName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pause record after Remove: %v, want gone", err)
	}
}

// TestPauseFailsCleanly: a commit the node refuses leaves the pod running, owning its
// NetworkPolicy, and no pause record.
func TestPauseFailsCleanly(t *testing.T) {
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "X", Message: "disk full"})
	}))
	defer node.Close()
	_, portStr, _ := net.SplitHostPort(node.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	name := kube.PodName("abc")
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: "uid-1"}}
	cs := fake.NewClientset(
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", UID: "uid-1", Labels: map[string]string{kube.LabelSandboxID: "abc"}},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: kube.ContainerName, Image: "i"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "127.0.0.1",
				ContainerStatuses: []corev1.ContainerStatus{{Name: kube.ContainerName, ContainerID: "containerd://c0ffee"}}},
		},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", OwnerReferences: owner}},
	)
	rt, err := kube.New(kube.Config{Client: cs, Namespace: "sbx", Instance: "i",
		Snapshots: &kube.SnapshotConfig{EgressdPort: port, APIKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Pause(ctx, name); err == nil {
		t.Fatal("Pause with a failing commit: no error")
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the pod after a failed pause: %v", err)
	}
	if np, _ := cs.NetworkingV1().NetworkPolicies("sbx").Get(ctx, name, metav1.GetOptions{}); len(np.OwnerReferences) != 1 {
		t.Errorf("the NetworkPolicy after a failed pause is owned by %v", np.OwnerReferences)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(ctx, kube.PauseSecretName("abc"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a pause record after a failed pause: %v", err)
	}
}
