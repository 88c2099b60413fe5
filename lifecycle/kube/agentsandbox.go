package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/airlockdev/airlock/lifecycle"
)

// AgentSandboxGVR is the kubernetes-sigs/agent-sandbox Sandbox resource
// (agents.x-k8s.io/v1alpha1, kind Sandbox): its controller makes one pod from
// spec.podTemplate, named as the Sandbox unless annotation AgentSandboxPodName says
// otherwise.
var AgentSandboxGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxes"}

// AgentSandboxPodName is the Sandbox annotation naming its pod when the controller
// adopted one of another name (a warm pool's).
const AgentSandboxPodName = "agents.x-k8s.io/pod-name"

// createAgentSandbox creates the Sandbox resource whose pod template is pod's and
// returns the owner reference of the Sandbox.
func (r *Runtime) createAgentSandbox(ctx context.Context, pod *corev1.Pod) (metav1.OwnerReference, error) {
	tmpl, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&pod.Spec)
	if err != nil {
		return metav1.OwnerReference{}, err
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": AgentSandboxGVR.GroupVersion().String(),
		"kind":       "Sandbox",
		"metadata": map[string]any{
			"name": pod.Name, "namespace": pod.Namespace,
			"labels": toAny(pod.Labels), "annotations": toAny(pod.Annotations),
		},
		"spec": map[string]any{"podTemplate": map[string]any{
			"metadata": map[string]any{"labels": toAny(pod.Labels), "annotations": toAny(pod.Annotations)},
			"spec":     tmpl,
		}},
	}}
	got, err := r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(pod.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return metav1.OwnerReference{}, err
	}
	return metav1.OwnerReference{APIVersion: got.GetAPIVersion(), Kind: got.GetKind(), Name: got.GetName(), UID: got.GetUID()}, nil
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// podNameOf is the pod a Sandbox owns.
func podNameOf(sb *unstructured.Unstructured) string {
	if n := sb.GetAnnotations()[AgentSandboxPodName]; n != "" {
		return n
	}
	return sb.GetName()
}

// inspectAgentSandbox: gone when the Sandbox is; created while its pod is not made.
func (r *Runtime) inspectAgentSandbox(ctx context.Context, name string) (lifecycle.Instance, error) {
	sb, err := r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return lifecycle.Instance{}, fmt.Errorf("%w: agent-sandbox Sandbox %s", lifecycle.ErrInstanceGone, name)
	}
	if err != nil {
		return lifecycle.Instance{}, fmt.Errorf("kube: reading agent-sandbox Sandbox %s: %w", name, err)
	}
	pod, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, podNameOf(sb), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return lifecycle.Instance{}, fmt.Errorf("kube: reading pod %s: %w", podNameOf(sb), err)
	}
	return sandboxInstance(sb, pod), nil
}

// sandboxInstance is the Sandbox's view: its pod's, named by the Sandbox.
func sandboxInstance(sb *unstructured.Unstructured, pod *corev1.Pod) lifecycle.Instance {
	in := lifecycle.Instance{SandboxID: sb.GetLabels()[LabelSandboxID], Phase: lifecycle.PhaseCreated}
	if pod != nil {
		in = instanceOf(pod)
	}
	in.ContainerID = sb.GetName()
	if sb.GetDeletionTimestamp() != nil {
		in.Phase = lifecycle.PhaseExited
	}
	return in
}

// listAgentSandboxes lists the instance's Sandboxes with their pods (pods by name).
func (r *Runtime) listAgentSandboxes(ctx context.Context, sel metav1.ListOptions, pods map[string]*corev1.Pod) ([]lifecycle.Instance, error) {
	sbs, err := r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(r.cfg.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("kube: listing agent-sandbox Sandboxes: %w", err)
	}
	byName := make(map[string]*unstructured.Unstructured, len(sbs.Items))
	for i := range sbs.Items {
		byName[sbs.Items[i].GetName()] = &sbs.Items[i]
	}
	out := make([]lifecycle.Instance, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		sb := byName[name]
		out = append(out, sandboxInstance(sb, pods[podNameOf(sb)]))
	}
	return out, nil
}
