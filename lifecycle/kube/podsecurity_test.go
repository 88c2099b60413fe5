package kube_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle/kube"
)

// TestSandboxPodPassesBaseline: in a namespace where the API server's Pod Security
// admission enforces "baseline" (what deploy/kubernetes gives the sandbox namespace in
// every overlay), a sandbox pod as lifecycle builds it is admitted with every option a
// create request may carry (the execd token, trusted CAs with the second init
// container, a PVC, limits, a runtime class, DNS, a platform); a host-path volume is
// refused there, as the manifests document (it needs "privileged").
func TestSandboxPodPassesBaseline(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	ns, err := w.env.Client.CoreV1().Namespaces().Get(ctx, w.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}
	if _, err := w.env.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = w.env.Client.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rt := w.runtime(t, func(c *kube.Config) {
		c.RuntimeClassName = "gvisor"
		c.DNS = []netip.Addr{netip.MustParseAddr("169.254.20.10")}
		c.AllowedHostRoots = []string{"/srv/airlock"}
	})

	// The namespace enforces: a pod asking for more than baseline is refused.
	spec := fullSpec("psa-host")
	spec.ImageAuth = nil
	if _, err := rt.Create(ctx, spec); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("a sandbox with a host-path volume in a baseline namespace: %v, want a PodSecurity refusal", err)
	}

	spec = fullSpec("psa1")
	spec.Volumes = spec.Volumes[:1] // the PVC, not the host path
	spec.ExecdToken = "tok-0123456789abcdefghijklmnopqrstuvwxyzABCD"
	inst, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("a sandbox pod is refused in a baseline namespace: %v", err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, inst.ContainerID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 2 {
		t.Errorf("init containers %d, want execd's and the trust one (every container checked)", len(pod.Spec.InitContainers))
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 || sc.Privileged == nil || *sc.Privileged {
			t.Errorf("container %s: security context %+v, want no added capabilities and not privileged", c.Name, sc)
		}
	}
	if err := rt.Remove(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
}
