package kube_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

// TestCreateNodeExecd: with Config.ExecdClaim a sandbox pod has no execd init container:
// the claim is mounted read-only at NodeExecdDir, execd runs from there with only the
// token's SHA-256 on its command line (the token is nowhere in the pod, and no Secret
// is made); a sandbox that must trust CAs gets the trust init container alone, running
// the node's execd into an emptyDir at ExecdDir. Both pass Pod Security "baseline".
func TestCreateNodeExecd(t *testing.T) {
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
	rt := w.runtime(t, func(c *kube.Config) { c.ExecdClaim = "airlock-execd" })
	const tok = "tok-0123456789abcdefghijklmnopqrstuvwxyzABCD"
	sum := sha256.Sum256([]byte(tok))
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "node1", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}, Hold: true, ExecdToken: tok})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-node1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(pod); strings.Contains(string(b), tok) {
		t.Fatalf("the pod spec holds the token")
	}
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("init containers %v, want none", pod.Spec.InitContainers)
	}
	c := pod.Spec.Containers[0]
	want := []string{kube.NodeExecdPath, "--exec", "--hold", "--access-token-sha256", hex.EncodeToString(sum[:]), "--", "sleep", "inf"}
	if !slices.Equal(c.Command, want) {
		t.Errorf("command %q, want %q", c.Command, want)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != kube.NodeExecdDir || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
	if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].PersistentVolumeClaim == nil ||
		pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "airlock-execd" || !pod.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly {
		t.Errorf("volumes %+v", pod.Spec.Volumes)
	}
	if _, err := w.env.Client.CoreV1().Secrets(w.ns).Get(ctx, kube.ExecdTokenSecretName("node1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an execd token Secret was made: %v", err)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}

	spec := lifecycle.Spec{SandboxID: "node2", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}, Hold: true, ExecdToken: tok,
		TrustedCAPEM: []byte(testCA)}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	pod, err = w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-node2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != kube.TrustContainerName {
		t.Fatalf("init containers %+v, want the trust one alone", pod.Spec.InitContainers)
	}
	ic := pod.Spec.InitContainers[0]
	if !slices.Equal(ic.Command, []string{kube.NodeExecdPath, "--install-trust", kube.ExecdDir}) || len(ic.VolumeMounts) != 2 {
		t.Errorf("trust init container %q mounts %+v", ic.Command, ic.VolumeMounts)
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["SSL_CERT_FILE"] != kube.TrustBundlePath || env["NODE_EXTRA_CA_CERTS"] != kube.TrustExtraPath {
		t.Errorf("env %v", env)
	}
	mounts := map[string]bool{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = m.ReadOnly
	}
	if ro, ok := mounts[kube.ExecdDir]; !ok || !ro || !mounts[kube.NodeExecdDir] {
		t.Errorf("sandbox container mounts %v", mounts)
	}
}

// TestWaitRunning: WaitRunning returns as soon as the pod's status says Running with an
// address (set here as a kubelet would), the view's phase exited for a pod that ends,
// ErrInstanceGone for a missing or deleted pod, and ctx's error when it ends first.
func TestWaitRunning(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	ctx := t.Context()
	pods := w.env.Client.CoreV1().Pods(w.ns)
	if _, err := rt.WaitRunning(ctx, "sbx-missing"); !errors.Is(err, lifecycle.ErrInstanceGone) {
		t.Errorf("missing pod: %v, want ErrInstanceGone", err)
	}
	for _, id := range []string{"wait1", "wait2", "wait3"} {
		if _, err := rt.Create(ctx, lifecycle.Spec{SandboxID: id, Image: "debian:12", Entrypoint: []string{"sleep", "inf"}}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if in, err := rt.WaitRunning(short, "sbx-wait1"); !errors.Is(err, context.DeadlineExceeded) || in.Phase != lifecycle.PhaseCreated {
		t.Errorf("pending pod: %+v, %v, want created and DeadlineExceeded", in, err)
	}
	setStatus := func(name string, phase corev1.PodPhase, ip string) {
		t.Helper()
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase, p.Status.PodIP, p.Status.HostIP = phase, ip, "10.0.0.1"
		if ip != "" {
			p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		in  lifecycle.Instance
		err error
		at  time.Time
	}
	wait := func(name string) chan result {
		ch := make(chan result, 1)
		go func() {
			in, err := rt.WaitRunning(ctx, name)
			ch <- result{in, err, time.Now()}
		}()
		time.Sleep(100 * time.Millisecond) // the watch is established
		return ch
	}
	ch := wait("sbx-wait1")
	setStatus("sbx-wait1", corev1.PodRunning, "10.1.2.3")
	set := time.Now()
	r := <-ch
	if r.err != nil || r.in.Phase != lifecycle.PhaseRunning || r.in.Address.String() != "10.1.2.3" {
		t.Errorf("running pod: %+v, %v", r.in, r.err)
	}
	if d := r.at.Sub(set); d > 500*time.Millisecond {
		t.Errorf("WaitRunning returned %s after the status update", d)
	}
	// Already running: at once.
	if in, err := rt.WaitRunning(ctx, "sbx-wait1"); err != nil || in.Phase != lifecycle.PhaseRunning {
		t.Errorf("running pod again: %+v, %v", in, err)
	}
	ch = wait("sbx-wait2")
	setStatus("sbx-wait2", corev1.PodFailed, "")
	if r := <-ch; r.err != nil || r.in.Phase != lifecycle.PhaseExited {
		t.Errorf("failed pod: %+v, %v, want exited", r.in, r.err)
	}
	ch = wait("sbx-wait3")
	zero := int64(0)
	if err := pods.Delete(ctx, "sbx-wait3", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; !errors.Is(r.err, lifecycle.ErrInstanceGone) && r.in.Phase != lifecycle.PhaseExited {
		t.Errorf("deleted pod: %+v, %v, want ErrInstanceGone or exited", r.in, r.err)
	}
}
