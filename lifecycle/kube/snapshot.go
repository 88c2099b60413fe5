package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// Snapshots on Kubernetes (lifecycle.Snapshotter): the sandbox pod's container is
// committed on its node by the node's egressd (`airlock egressd --containerd-socket`,
// watch.SnapshotPath, behind the API key) through the node's containerd
// (egressd/ctrsnap): its root filesystem without its mounts (execd's emptyDir, the
// token, the user's volumes). The image stays on that node, in containerd's k8s.io
// namespace, named watch.SnapshotRefPrefix+"<node>:<snapshot id>" (node-local: no
// registry push). A restore's pod is bound to that node (a required node affinity on
// metadata.name) and never pulls the image (imagePullPolicy Never). A snapshot outlives
// its sandbox but not its node's containerd store.

// SnapshotConfig enables snapshots (Config.Snapshots).
type SnapshotConfig struct {
	// EgressdPort is where each node's egressd serves watch.SnapshotPath (its
	// --metrics-listen port, at the node's address). Required.
	EgressdPort int
	// APIKey authenticates to the nodes' egressd. Required.
	APIKey string
	// EgressdNamespace and EgressdSelector find the egressd pod of a node (a host-network
	// pod: its address is the node's) when a snapshot is deleted; defaults
	// SystemNamespace and app.kubernetes.io/name=airlock-egressd.
	EgressdNamespace string
	EgressdSelector  map[string]string
	// Timeout bounds one commit on the node; default 15 minutes.
	Timeout time.Duration
}

// snapshotTrustEnv are the variables podFor sets for a sandbox that trusts extra CAs:
// they point into execd's emptyDir, which a snapshot does not hold.
var snapshotTrustEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"}

// CanSnapshot implements lifecycle.SnapshotChecker: nil when Config.Snapshots is set.
func (r *Runtime) CanSnapshot() error {
	if r.cfg.Snapshots == nil {
		return fmt.Errorf("%w: snapshots need the nodes' egressd with --containerd-socket (lifecycle --snapshots)", lifecycle.ErrNotImplemented)
	}
	return nil
}

// SnapshotRef is the image reference of snapshot id on node.
func SnapshotRef(node, id string) string {
	return watch.SnapshotRefPrefix + node + ":" + strings.ToLower(id)
}

// snapshotNode is the node of a snapshot image reference ("" when ref is not one).
func snapshotNode(ref string) string {
	rest, ok := strings.CutPrefix(ref, watch.SnapshotRefPrefix)
	if !ok {
		return ""
	}
	node, _, _ := strings.Cut(rest, ":")
	return node
}

// Snapshot implements lifecycle.Snapshotter: the node's egressd commits the pod's
// sandbox container. The pod must be running on a node with its container started.
func (r *Runtime) Snapshot(ctx context.Context, inst lifecycle.Instance, snapshotID string, trustInstalled bool) (lifecycle.SnapshotArtifact, error) {
	var art lifecycle.SnapshotArtifact
	if err := r.CanSnapshot(); err != nil {
		return art, err
	}
	pod, err := r.sandboxPod(ctx, inst.SandboxID)
	if err != nil {
		return art, err
	}
	out, err := r.commitPod(ctx, pod, inst.SandboxID, SnapshotRef(pod.Spec.NodeName, snapshotID), snapshotID, trustInstalled)
	if err != nil {
		return art, err
	}
	return lifecycle.SnapshotArtifact{Ref: out.Ref, Bytes: out.Bytes}, nil
}

// commitPod has the egressd of pod's node commit the sandbox container of sandbox id
// into image ref (snapshots and pauses alike), leaving the trust variables out with
// dropTrust.
func (r *Runtime) commitPod(ctx context.Context, pod *corev1.Pod, id, ref, snapshotID string, dropTrust bool) (watch.SnapshotCommitted, error) {
	var out watch.SnapshotCommitted
	var cid string
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName {
			cid = cs.ContainerID
		}
	}
	runtimeName, ctrID, ok := strings.Cut(cid, "://")
	if !ok || runtimeName != "containerd" || pod.Spec.NodeName == "" || pod.Status.HostIP == "" {
		return out, fmt.Errorf("kube: the sandbox's container is not running in containerd on a node (container %q, node %q)", cid, pod.Spec.NodeName)
	}
	req := watch.SnapshotCommit{Namespace: pod.Namespace, Pod: pod.Name, Container: ContainerName, ContainerID: ctrID,
		Ref: ref, SnapshotID: snapshotID}
	if dropTrust {
		req.DropEnv = snapshotTrustEnv
	}
	timeout := r.cfg.Snapshots.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Minute
	}
	err := r.nodeCall(ctx, timeout, pod.Status.HostIP, id, req, &out)
	return out, err
}

// sandboxPod is sandbox id's pod: named PodName(id), or (the agent-sandbox provider's
// controller may name it otherwise) the one labelled with the sandbox id.
func (r *Runtime) sandboxPod(ctx context.Context, id string) (*corev1.Pod, error) {
	pods := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace)
	pod, err := pods.Get(ctx, PodName(id), metav1.GetOptions{})
	if err == nil {
		return pod, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kube: reading the sandbox's pod: %w", err)
	}
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: LabelSandboxID + "=" + id})
	if err != nil {
		return nil, fmt.Errorf("kube: finding the sandbox's pod: %w", err)
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("kube: sandbox %s has no pod", id)
	}
	return &list.Items[0], nil
}

// RemoveSnapshot implements lifecycle.Snapshotter: the egressd of the image's node
// deletes it. A node without an egressd pod (gone from the cluster) has nothing to
// remove.
func (r *Runtime) RemoveSnapshot(ctx context.Context, ref string) error {
	if err := r.CanSnapshot(); err != nil {
		return err
	}
	node := snapshotNode(ref)
	if node == "" {
		return fmt.Errorf("kube: %q is not a snapshot image", ref)
	}
	sc := r.cfg.Snapshots
	ns := sc.EgressdNamespace
	if ns == "" {
		ns = r.cfg.SystemNamespace
	}
	sel := sc.EgressdSelector
	if len(sel) == 0 {
		sel = map[string]string{"app.kubernetes.io/name": "airlock-egressd"}
	}
	pods, err := r.cfg.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: sel}),
		FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil {
		return fmt.Errorf("kube: finding the egressd of node %s: %w", node, err)
	}
	host := ""
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.HostIP != "" {
			host = p.Status.HostIP
		}
	}
	if host == "" {
		if len(pods.Items) == 0 {
			r.log.Warn("no egressd on the snapshot's node; its image is left to the node", "ref", ref, "node", node)
			return nil
		}
		return fmt.Errorf("kube: the egressd of node %s is not running", node)
	}
	return r.nodeCall(ctx, 2*time.Minute, host, "remove", watch.SnapshotRemove{Ref: ref}, nil)
}

// nodeCall POSTs body to watch.SnapshotPath+path on the egressd at host and decodes a
// 200's body into out.
func (r *Runtime) nodeCall(ctx context.Context, timeout time.Duration, host, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(r.cfg.Snapshots.EgressdPort)) + watch.SnapshotPath + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.HeaderAPIKey, r.cfg.Snapshots.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("kube: the node's egressd: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusOK && out != nil:
		return json.Unmarshal(raw, out)
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusNoContent:
		return nil
	}
	var e opensandbox.ErrorBody
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return fmt.Errorf("kube: the node's egressd answered %s: %s", resp.Status, e.Message)
	}
	return fmt.Errorf("kube: the node's egressd answered %s", resp.Status)
}

// restoreOnNode binds pod to the node holding its snapshot image when image is one
// (a required node affinity on metadata.name) and keeps the node from pulling it
// (imagePullPolicy Never on every container running it).
func restoreOnNode(pod *corev1.Pod, image string) {
	node := snapshotNode(image)
	if node == "" {
		return
	}
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Image == image {
			pod.Spec.InitContainers[i].ImagePullPolicy = corev1.PullNever
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Image == image {
			pod.Spec.Containers[i].ImagePullPolicy = corev1.PullNever
		}
	}
}

var (
	_ lifecycle.Snapshotter     = (*Runtime)(nil)
	_ lifecycle.SnapshotChecker = (*Runtime)(nil)
)
