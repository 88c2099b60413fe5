package kube_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

// TestAgentSandbox: the provider creates a kubernetes-sigs/agent-sandbox Sandbox whose
// pod template is the pod the pod provider makes; the test plays its controller (a pod
// of the same name from the template, owned by the Sandbox) and the kubelet.
func TestAgentSandbox(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) {
		c.Provider = kube.ProviderAgentSandbox
		c.DNS = []netip.Addr{netip.MustParseAddr("169.254.20.10")}
		c.AllowedHostRoots = []string{"/srv/airlock"}
	})
	ctx := t.Context()
	spec := fullSpec("as1")
	inst, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ContainerID != "sbx-as1" || inst.Phase != lifecycle.PhaseCreated {
		t.Errorf("instance %+v", inst)
	}
	sandboxes := w.dyn.Resource(kube.AgentSandboxGVR).Namespace(w.ns)
	sb, err := sandboxes.Get(ctx, "sbx-as1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetKind() != "Sandbox" || sb.GetAPIVersion() != "agents.x-k8s.io/v1alpha1" || sb.GetLabels()["airlock.dev/instance"] != "inst-a" {
		t.Errorf("sandbox %s %s labels %v", sb.GetAPIVersion(), sb.GetKind(), sb.GetLabels())
	}
	tmplMap, ok, err := unstructured.NestedMap(sb.Object, "spec", "podTemplate")
	if err != nil || !ok {
		t.Fatalf("spec.podTemplate: %v %v", ok, err)
	}
	var tmpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmplMap, &tmpl); err != nil {
		t.Fatal(err)
	}
	if tmpl.Labels["airlock.dev/sandbox-id"] != "as1" || tmpl.Annotations["airlock.dev/entrypoint"] == "" {
		t.Errorf("template metadata %+v", tmpl.ObjectMeta)
	}
	ts := tmpl.Spec
	if len(ts.Containers) != 1 || len(ts.InitContainers) != 2 || ts.InitContainers[0].Image != "airlock/execd:test" ||
		!slices.Equal(ts.Containers[0].Command, []string{"/opt/airlock-execd/execd", "--exec", "--hold", "--", "python3", "-m", "http.server", "8080"}) ||
		ts.DNSPolicy != corev1.DNSNone || *ts.AutomountServiceAccountToken ||
		!slices.Equal(ts.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "sbx-as1-pull"}}) {
		t.Errorf("pod template spec %+v", ts)
	}
	if sc := ts.Containers[0].SecurityContext; sc == nil || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != len(kube.DroppedCapabilities) {
		t.Errorf("template security context %+v", sc)
	}
	// The NetworkPolicy and the pull Secret belong to the Sandbox.
	np, err := w.env.Client.NetworkingV1().NetworkPolicies(w.ns).Get(ctx, "sbx-as1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec, err := w.env.Client.CoreV1().Secrets(w.ns).Get(ctx, "sbx-as1-pull", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, refs := range map[string][]metav1.OwnerReference{"NetworkPolicy": np.OwnerReferences, "Secret": sec.OwnerReferences} {
		if len(refs) != 1 || refs[0].Kind != "Sandbox" || refs[0].APIVersion != "agents.x-k8s.io/v1alpha1" || refs[0].UID != sb.GetUID() {
			t.Errorf("%s owners %+v", what, refs)
		}
	}

	// No pod yet: created, and listed.
	if in, err := rt.Inspect(ctx, "sbx-as1"); err != nil || in.Phase != lifecycle.PhaseCreated || in.SandboxID != "as1" {
		t.Errorf("inspect before the pod: %+v %v", in, err)
	}
	if list, err := rt.List(ctx); err != nil || len(list) != 1 || list[0].SandboxID != "as1" || list[0].ContainerID != "sbx-as1" {
		t.Errorf("list before the pod: %+v %v", list, err)
	}

	// The controller makes the pod; the kubelet runs it.
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Name, pod.Namespace = "sbx-as1", w.ns
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: sb.GetAPIVersion(), Kind: "Sandbox", Name: sb.GetName(), UID: sb.GetUID()}}
	if _, err := w.env.Client.CoreV1().Pods(w.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the template is not a valid pod: %v", err)
	}
	if err := w.env.SetPodRunning(ctx, w.ns, "sbx-as1", "node-b", "10.244.2.5"); err != nil {
		t.Fatal(err)
	}
	in, err := rt.Inspect(ctx, "sbx-as1")
	if err != nil || in.Phase != lifecycle.PhaseRunning || in.Address != netip.MustParseAddr("10.244.2.5") || in.Node != "node-b" || in.ContainerID != "sbx-as1" {
		t.Errorf("inspect running: %+v %v", in, err)
	}
	if list, err := rt.List(ctx); err != nil || len(list) != 1 || list[0].Phase != lifecycle.PhaseRunning {
		t.Errorf("list running: %+v %v", list, err)
	}

	// Remove: the Sandbox, its pod, NetworkPolicy and Secret.
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if n, names := w.objects(t); n != 0 {
		t.Errorf("left after Remove: %v", names)
	}
	if _, err := rt.Inspect(ctx, "sbx-as1"); !errors.Is(err, lifecycle.ErrInstanceGone) {
		t.Errorf("inspect after Remove: %v", err)
	}
}

// TestAgentSandboxBadInput: refused before anything is made.
func TestAgentSandboxBadInput(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) { c.Provider = kube.ProviderAgentSandbox })
	spec := lifecycle.Spec{SandboxID: "as2", Image: "debian:12", Entrypoint: []string{"true"},
		Volumes: []lifecycle.Volume{{Name: "h", Host: &lifecycle.HostVolume{Path: "/etc"}, MountPath: "/mnt"}}}
	if _, err := rt.Create(t.Context(), spec); !errors.Is(err, lifecycle.ErrInvalidVolume) {
		t.Fatalf("err %v", err)
	}
	if n, names := w.objects(t); n != 0 {
		t.Errorf("left behind: %v", names)
	}
}
