package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlockdev/airlock/lifecycle"
)

// Pause on Kubernetes (lifecycle.RecreatingPauser; needs Config.Snapshots): a pod
// cannot be frozen through the Kubernetes API, so Pause goes the way of OSEP-0008's
// pause: the node's egressd commits the pod's sandbox container (the snapshot path:
// its root filesystem without its mounts) into the node-local image PauseRef(node,
// id), a pause record Secret (PauseSecretName) keeps the pod as it was made, the
// NetworkPolicy and the execd token and image pull Secrets are released from the pod
// (they stay), and the pod is deleted. Resume makes the pod again from the record, the
// same name and sandbox id, with the pause image as the sandbox container's image,
// bound to that node and never pulled (restoreOnNode); lifecycle then takes it through
// the create's readiness. The pause image stays while the resumed sandbox lives (its
// pod runs from it, and a later snapshot or pause of it needs it: the node's commit
// reads the container's image); the sandbox's delete removes it with the record.

// Pause record Secret: label LabelPaused is "true" while the sandbox is paused,
// "false" once resumed; key pauseKeyPod holds the pod (JSON), pauseKeyImage the
// pause image reference.
const (
	LabelPaused   = "airlock.dev/paused"
	pauseKeyPod   = "pod"
	pauseKeyImage = "image"
)

// podGoneWait bounds Pause's wait for the deleted pod to be gone, podGonePoll spaces
// its questions.
const (
	podGoneWait = 2 * time.Minute
	podGonePoll = 200 * time.Millisecond
)

// ErrPauseUnavailable is what pause and resume answer on Kubernetes without snapshots
// (501 NOT_IMPLEMENTED, through lifecycle.PauseChecker). Its text names the
// alternatives.
var ErrPauseUnavailable = fmt.Errorf("%w: pause and resume on Kubernetes need snapshots (the nodes' egressd with "+
	"--containerd-socket, lifecycle --snapshots) and the pod provider; "+
	"instead keep the sandbox running and extend its life (POST /sandboxes/{id}/renew-expiration), "+
	"or delete it and create it again", lifecycle.ErrNotImplemented)

// PauseRef is the image reference of sandbox id's pause image on node: a tag of its
// own under the snapshot prefix ("pause-<id>"; snapshot ids start "snap-"), so the
// node's egressd commits and removes it as it does snapshots.
func PauseRef(node, id string) string { return SnapshotRef(node, "pause-"+id) }

// PauseSecretName is the pause record Secret of sandbox id.
func PauseSecretName(id string) string { return PodName(id) + "-pause" }

// CanPause implements lifecycle.PauseChecker: nil with Config.Snapshots and the pod
// provider, else ErrPauseUnavailable.
func (r *Runtime) CanPause() error {
	if r.cfg.Snapshots == nil || r.cfg.Provider != ProviderPod {
		return ErrPauseUnavailable
	}
	return nil
}

// Pause implements lifecycle.RecreatingPauser for pod name: commit, record, release
// the pod's objects, delete the pod and wait until it is gone. On error what it did is
// undone (the pod keeps running).
func (r *Runtime) Pause(ctx context.Context, name string) (err error) {
	if err := r.CanPause(); err != nil {
		return err
	}
	pods := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kube: reading pod %s: %w", name, err)
	}
	id := pod.Labels[LabelSandboxID]
	if id == "" || pod.Spec.NodeName == "" {
		return fmt.Errorf("kube: pod %s has no sandbox id or node", name)
	}
	ref := PauseRef(pod.Spec.NodeName, id)
	if _, err := r.commitPod(ctx, pod, id, ref, "pause-"+id, false); err != nil {
		return err
	}
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
	defer func() {
		if err == nil {
			return
		}
		uctx := context.WithoutCancel(ctx)
		_ = r.ownAll(uctx, id, &owner)
		_ = r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Delete(uctx, PauseSecretName(id), metav1.DeleteOptions{})
		if rmErr := r.RemoveSnapshot(uctx, ref); rmErr != nil {
			r.log.Error("removing the pause image of a failed pause failed", "sandbox_id", id, "err", rmErr)
		}
	}()
	sec, err := r.pauseRecord(pod, ref)
	if err != nil {
		return err
	}
	secrets := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace)
	if _, err = secrets.Create(ctx, sec, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{}) // left by an interrupted pause or an earlier one
	}
	if err != nil {
		return fmt.Errorf("kube: writing the pause record of %s: %w", id, err)
	}
	if err = r.ownAll(ctx, id, nil); err != nil {
		return err
	}
	zero := int64(0)
	if err = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: &metav1.Preconditions{UID: &pod.UID}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: deleting pod %s: %w", name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, podGoneWait)
	defer cancel()
	for {
		if _, gerr := pods.Get(wctx, name, metav1.GetOptions{}); apierrors.IsNotFound(gerr) {
			break
		}
		select {
		case <-wctx.Done():
			// The pod is going (its delete was accepted): nothing to undo any more.
			r.log.Warn("the paused sandbox's pod is still being deleted", "sandbox_id", id)
			return nil
		case <-time.After(podGonePoll):
		}
	}
	r.log.Debug("sandbox paused", "sandbox_id", id, "image", ref)
	return nil
}

// pauseRecord is the pause record Secret of pod, paused into image ref.
func (r *Runtime) pauseRecord(pod *corev1.Pod, ref string) (*corev1.Secret, error) {
	saved := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace,
			Labels: pod.Labels, Annotations: pod.Annotations},
		Spec: *pod.Spec.DeepCopy(),
	}
	b, err := json.Marshal(saved)
	if err != nil {
		return nil, fmt.Errorf("kube: encoding pod %s: %w", pod.Name, err)
	}
	id := pod.Labels[LabelSandboxID]
	labels := r.labels(id)
	labels[LabelPaused] = "true"
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PauseSecretName(id), Namespace: r.cfg.Namespace, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{pauseKeyPod: b, pauseKeyImage: []byte(ref)},
	}, nil
}

// resumePod is the pod a pause record makes again: the saved pod with the pause image
// as its sandbox container's image, unscheduled and bound to the image's node.
func resumePod(sec *corev1.Secret) (*corev1.Pod, error) {
	ref := string(sec.Data[pauseKeyImage])
	var pod corev1.Pod
	if err := json.Unmarshal(sec.Data[pauseKeyPod], &pod); err != nil || snapshotNode(ref) == "" {
		return nil, fmt.Errorf("kube: the pause record %s is damaged", sec.Name)
	}
	// Scheduling and admission fill these again (the Priority admission plugin refuses
	// a priority it did not compute).
	pod.Spec.NodeName, pod.Spec.Priority = "", nil
	found := false
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ContainerName {
			pod.Spec.Containers[i].Image, found = ref, true
		}
	}
	if !found {
		return nil, fmt.Errorf("kube: the pause record %s has no %s container", sec.Name, ContainerName)
	}
	restoreOnNode(&pod, ref)
	return &pod, nil
}

// Resume implements lifecycle.RecreatingPauser for pod name: the pod again from its
// pause record (only while its NetworkPolicy exists), then its objects owned by it once
// more. The pod's execd starts held
// (its command is the one it was made with); lifecycle releases it once ready.
func (r *Runtime) Resume(ctx context.Context, name string) error {
	if err := r.CanPause(); err != nil {
		return err
	}
	id := strings.TrimPrefix(name, PodName(""))
	sec, err := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Get(ctx, PauseSecretName(id), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kube: reading the pause record of %s: %w", id, err)
	}
	if sec.Labels[LabelPaused] != "true" {
		return fmt.Errorf("kube: sandbox %s is not paused", id)
	}
	pod, err := resumePod(sec)
	if err != nil {
		return err
	}
	// The second layer first, as at create: a resumed pod never runs without it.
	if _, err := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("kube: the NetworkPolicy of %s: %w", id, err)
	}
	pods := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace)
	var created *corev1.Pod
	until := time.Now().Add(podGoneWait)
	for {
		if created, err = pods.Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) || time.Now().After(until) {
			break
		}
		select { // the paused pod is still being deleted
		case <-ctx.Done():
			return fmt.Errorf("kube: the paused pod %s is still there: %w", name, ctx.Err())
		case <-time.After(podGonePoll):
		}
	}
	if err != nil {
		return fmt.Errorf("kube: making pod %s again: %w", name, err)
	}
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: created.Name, UID: created.UID}
	if err := r.ownAll(ctx, id, &owner); err != nil {
		zero := int64(0)
		_ = pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		return err
	}
	return nil
}

// Resumed implements lifecycle.RecreatingPauser: the pause record is marked resumed
// (the pause image stays, the pod runs from it).
func (r *Runtime) Resumed(ctx context.Context, inst lifecycle.Instance) error {
	patch := []byte(`{"metadata":{"labels":{"` + LabelPaused + `":"false"}}}`)
	_, err := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Patch(ctx, PauseSecretName(inst.SandboxID), types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// ownAll makes owner the owner of sandbox id's NetworkPolicy and its execd token and
// image pull Secrets (nil: of nothing, so they outlive the pod). The NetworkPolicy
// must exist; the Secrets need not.
func (r *Runtime) ownAll(ctx context.Context, id string, owner *metav1.OwnerReference) error {
	var refs []metav1.OwnerReference
	if owner != nil {
		refs = []metav1.OwnerReference{*owner}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
	if err != nil {
		return err
	}
	name := PodName(id)
	if _, err := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("kube: the NetworkPolicy of %s: %w", id, err)
	}
	var errs []error
	for _, s := range []string{ExecdTokenSecretName(id), PullSecretName(id)} {
		_, err := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Patch(ctx, s, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("kube: Secret %s: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

// pausedInstance is the view of a paused sandbox from its pause record (no pod).
func pausedInstance(sec *corev1.Secret) lifecycle.Instance {
	id := sec.Labels[LabelSandboxID]
	return lifecycle.Instance{SandboxID: id, ContainerID: PodName(id), Phase: lifecycle.PhasePaused,
		Node: snapshotNode(string(sec.Data[pauseKeyImage]))}
}

// inspectPaused is Inspect of pod name that does not exist: its paused view when its
// pause record says paused, else lifecycle.ErrInstanceGone.
func (r *Runtime) inspectPaused(ctx context.Context, name string) (lifecycle.Instance, error) {
	gone := fmt.Errorf("%w: pod %s", lifecycle.ErrInstanceGone, name)
	if r.CanPause() != nil {
		return lifecycle.Instance{}, gone
	}
	sec, err := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Get(ctx, PauseSecretName(strings.TrimPrefix(name, PodName(""))), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return lifecycle.Instance{}, gone
	case err != nil:
		return lifecycle.Instance{}, fmt.Errorf("kube: reading the pause record of %s: %w", name, err)
	case sec.Labels[LabelPaused] != "true":
		return lifecycle.Instance{}, gone
	}
	return pausedInstance(sec), nil
}

// removePaused removes sandbox id's pause image and record, if any.
func (r *Runtime) removePaused(ctx context.Context, id string) error {
	if r.CanPause() != nil {
		return nil
	}
	secrets := r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace)
	sec, err := secrets.Get(ctx, PauseSecretName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kube: reading the pause record of %s: %w", id, err)
	}
	if ref := string(sec.Data[pauseKeyImage]); ref != "" {
		if err := r.RemoveSnapshot(ctx, ref); err != nil {
			return fmt.Errorf("kube: removing the pause image of %s: %w", id, err)
		}
	}
	if err := secrets.Delete(ctx, sec.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: deleting the pause record of %s: %w", id, err)
	}
	return nil
}

var _ lifecycle.RecreatingPauser = (*Runtime)(nil)
