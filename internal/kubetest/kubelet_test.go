package kubetest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
)

// The tests' Docker networks (one each: TestKubeletRecreatesNetwork removes its own).
const (
	testNetwork  = "altest-klt0"
	testNetwork2 = "altest-klt1"
)

func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	lctest.RemoveNetwork(testNetwork)
	lctest.RemoveNetwork(testNetwork2)
	os.Exit(code)
}

// sandboxPod is a pod in the shape lifecycle/kube creates.
func sandboxPod(id, image string, entry []string, hold bool, env ...corev1.EnvVar) *corev1.Pod {
	a, _ := json.Marshal(entry)
	cmd := []string{"/opt/airlock/execd", "--exec"}
	if hold {
		cmd = append(cmd, "--hold")
	}
	cmd = append(append(cmd, "--"), entry...)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "sbx-" + id,
			Labels:      map[string]string{podLabelSandboxID: id},
			Annotations: map[string]string{podAnnotationEntrypoint: string(a)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{{
				Name: "execd", Image: "airlock/execd:test", Command: []string{"/execd", "--install", "/opt/airlock/execd"},
			}},
			Containers: []corev1.Container{{Name: podContainerName, Image: image, Command: cmd, Env: env}},
		},
	}
}

func TestPodSpec(t *testing.T) {
	withLimits := sandboxPod("lim", "img", []string{"sleep", "1"}, false)
	withLimits.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	noAnnotation := sandboxPod("cmd", "img", []string{"sh", "-c", "x -- y"}, true)
	delete(noAnnotation.Annotations, podAnnotationEntrypoint)
	noLabel := sandboxPod("nolabel", "img", []string{"sleep", "1"}, false)
	noLabel.Labels = nil
	noContainer := sandboxPod("noctr", "img", []string{"sleep", "1"}, false)
	noContainer.Spec.Containers[0].Name = "main"
	badAnnotation := sandboxPod("badann", "img", []string{"sleep", "1"}, false)
	badAnnotation.Annotations[podAnnotationEntrypoint] = `"sleep 1"`
	valueFrom := sandboxPod("vf", "img", []string{"sleep", "1"}, false,
		corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})

	images := map[string]string{"python:3.12": "airlock/sandbox:latest"}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		want    lifecycle.Spec
		wantErr string
	}{
		{"mapped_image_env_entrypoint", sandboxPod("a1", "python:3.12", []string{"sleep", "infinity"}, false,
			corev1.EnvVar{Name: "A", Value: "1"}, corev1.EnvVar{Name: "B", Value: ""}),
			lifecycle.Spec{SandboxID: "a1", Image: "airlock/sandbox:latest", Entrypoint: []string{"sleep", "infinity"},
				Env: map[string]string{"A": "1", "B": ""}}, ""},
		{"hold", sandboxPod("h1", "img", []string{"sleep", "1"}, true),
			lifecycle.Spec{SandboxID: "h1", Image: "img", Entrypoint: []string{"sleep", "1"}, Hold: true}, ""},
		{"hold_flag_only_before_dashes", sandboxPod("h2", "img", []string{"echo", "--hold"}, false),
			lifecycle.Spec{SandboxID: "h2", Image: "img", Entrypoint: []string{"echo", "--hold"}}, ""},
		{"entrypoint_from_command", noAnnotation,
			lifecycle.Spec{SandboxID: "cmd", Image: "img", Entrypoint: []string{"sh", "-c", "x -- y"}, Hold: true}, ""},
		{"limits", withLimits,
			lifecycle.Spec{SandboxID: "lim", Image: "img", Entrypoint: []string{"sleep", "1"}, NanoCPUs: 500_000_000, MemoryBytes: 256 << 20}, ""},
		{"no_label", noLabel, lifecycle.Spec{}, "no airlock.dev/sandbox-id label"},
		{"no_sandbox_container", noContainer, lifecycle.Spec{}, `no container "sandbox"`},
		{"bad_annotation", badAnnotation, lifecycle.Spec{}, "not a JSON array"},
		{"value_from", valueFrom, lifecycle.Spec{}, "valueFrom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podSpec(tc.pod, images)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.SandboxID != tc.want.SandboxID || got.Image != tc.want.Image || got.Hold != tc.want.Hold ||
				!slices.Equal(got.Entrypoint, tc.want.Entrypoint) || len(got.Env) != len(tc.want.Env) ||
				got.NanoCPUs != tc.want.NanoCPUs || got.MemoryBytes != tc.want.MemoryBytes {
				t.Fatalf("spec %+v, want %+v", got, tc.want)
			}
			for k, v := range tc.want.Env {
				if gv, ok := got.Env[k]; !ok || gv != v {
					t.Errorf("env %s=%q, want %q", k, gv, v)
				}
			}
		})
	}
}

// waitPod waits until cond holds for pod ns/name and returns it.
func waitPod(t *testing.T, e *Env, ns, name string, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s: waiting until %s: %v (last status %+v)", name, what, err, last.Status)
	}
	return last
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" }

// execd calls execd at addr:44772 and returns the status and body.
func execd(t *testing.T, addr, method, pathQuery, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+net.JoinHostPort(addr, "44772")+pathQuery, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-EXECD-ACCESS-TOKEN", token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, pathQuery, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// download polls execd for the file at path until it exists (an entrypoint may still
// be starting) and returns its content.
func download(t *testing.T, addr, path, token string) string {
	t.Helper()
	var body string
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var code int
		code, body = execd(t, addr, http.MethodGet, "/files/download?path="+path, "", token)
		return code == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("%s in the sandbox: %v (last answer %s)", path, err, body)
	}
	return body
}

func gone(t *testing.T, cli *client.Client, id string) bool {
	t.Helper()
	_, err := cli.ContainerInspect(t.Context(), id, client.ContainerInspectOptions{})
	if err != nil && !cerrdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return cerrdefs.IsNotFound(err)
}

// TestKubeletRunsPods creates sandbox pods by hand and checks what the kubelet makes of
// them: a real container behind the pod IP with the pod's image (mapped), entrypoint
// and env, execd answering there (with the token from the env; held with --hold until
// released), a
// pod with an image not on this host Failed, a deleted pod's container removed and the
// deletion confirmed, and Close removing what is left.
func TestKubeletRunsPods(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	e := Shared(t)
	cli := lctest.Docker(t)
	ns := e.Namespace(t, "kubelet")
	k := e.RunKubelet(t, KubeletConfig{
		Namespace: ns, Node: "node-a", ExecdPath: lctest.Execd(t), Network: testNetwork,
		Images: map[string]string{"registry.example/python:3.12": img},
	})
	pods := e.Client.CoreV1().Pods(ns)
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const token = "kubelet-test-token"
	create(sandboxPod("klrun1", "registry.example/python:3.12",
		[]string{"sh", "-c", `printf '%s' "$GREETING" > /tmp/greeting; exec sleep infinity`}, false,
		corev1.EnvVar{Name: "EXECD_ACCESS_TOKEN", Value: token}, corev1.EnvVar{Name: "GREETING", Value: "hello from the pod"}))
	create(sandboxPod("klhold1", img, []string{"sh", "-c", `printf '%s' "$RELEASED" > /tmp/released; exec sleep infinity`}, true))
	create(sandboxPod("klbad1", "registry.example/missing:1", []string{"sleep", "infinity"}, false))

	// A missing image is never pulled: the pod fails with the reason.
	bad := waitPod(t, e, ns, "sbx-klbad1", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if bad.Status.Reason != "ErrImagePull" || !strings.Contains(bad.Status.Message, "registry.example/missing:1") {
		t.Errorf("failed pod: reason %q message %q", bad.Status.Reason, bad.Status.Message)
	}
	if _, ok := k.Container("sbx-klbad1"); ok {
		t.Error("a container backs the failed pod")
	}

	// The running pod: bound, Ready, its IP the container's, execd there.
	p := waitPod(t, e, ns, "sbx-klrun1", "Running", running)
	inst, ok := k.Container("sbx-klrun1")
	if !ok {
		t.Fatal("no container for the running pod")
	}
	if p.Spec.NodeName != "node-a" || p.Status.PodIP != inst.Address.String() || inst.Pid == 0 || inst.SandboxID != "klrun1" {
		t.Fatalf("pod node %q ip %q; container %+v", p.Spec.NodeName, p.Status.PodIP, inst)
	}
	if _, subnet, _ := k.Network(); !subnet.Contains(netip.MustParseAddr(p.Status.PodIP)) {
		t.Errorf("pod IP %s outside the network %s", p.Status.PodIP, subnet)
	}
	if i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady }); i < 0 || p.Status.Conditions[i].Status != corev1.ConditionTrue {
		t.Errorf("pod not Ready: %+v", p.Status.Conditions)
	}
	if code, body := execd(t, p.Status.PodIP, http.MethodGet, "/ping", "", ""); code != http.StatusOK {
		t.Fatalf("execd /ping: %d %s", code, body)
	}
	if code, _ := execd(t, p.Status.PodIP, http.MethodGet, "/files/download?path=/tmp/greeting", "", ""); code != http.StatusUnauthorized {
		t.Errorf("execd without the token from the pod's env: %d, want 401", code)
	}
	// The entrypoint (from the annotation) wrote the env it got.
	if got := download(t, p.Status.PodIP, "/tmp/greeting", token); got != "hello from the pod" {
		t.Errorf("the entrypoint wrote %q", got)
	}

	// The held pod: execd took --hold (only a held execd accepts a release with a
	// body) and starts the entrypoint with the release's env.
	hp := waitPod(t, e, ns, "sbx-klhold1", "Running", running)
	if code, _ := execd(t, hp.Status.PodIP, http.MethodGet, "/ping", "", ""); code != http.StatusOK {
		t.Errorf("held execd /ping: %d", code)
	}
	if code, body := execd(t, hp.Status.PodIP, http.MethodPost, "/_airlock/release", `{"env":{"RELEASED":"yes"}}`, ""); code != http.StatusNoContent {
		t.Fatalf("release: %d %s", code, body)
	}
	if got := download(t, hp.Status.PodIP, "/tmp/released", ""); got != "yes" {
		t.Errorf("the released entrypoint wrote %q", got)
	}
	held, ok := k.Container("sbx-klhold1")
	if !ok {
		t.Fatal("no container for the held pod")
	}

	// Deletion with the default grace period: the kubelet removes the container and
	// confirms, so the pod goes.
	if err := pods.Delete(t.Context(), "sbx-klrun1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, "sbx-klrun1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the deleted pod stays: %v", err)
	}
	if _, ok := k.Container("sbx-klrun1"); ok || !gone(t, cli, inst.ContainerID) {
		t.Errorf("the deleted pod's container %s stays", inst.ContainerID)
	}
	if gone(t, cli, held.ContainerID) {
		t.Fatal("the held pod's container went with the other pod")
	}

	// Close removes what is left.
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(t, cli, held.ContainerID) {
		t.Errorf("the held pod's container %s stays after Close", held.ContainerID)
	}
}

// TestKubeletRecreatesNetwork removes the kubelet's network behind its back (as
// another test process sharing the name does when it ends) and checks that the next
// pod still runs, with execd reachable at its pod IP.
func TestKubeletRecreatesNetwork(t *testing.T) {
	testenv.NeedSandboxImage(t)
	e := Shared(t)
	cli := lctest.Docker(t)
	ns := e.Namespace(t, "kubelet")
	e.RunKubelet(t, KubeletConfig{Namespace: ns, ExecdPath: lctest.Execd(t), Network: testNetwork2})
	if _, err := cli.NetworkRemove(t.Context(), testNetwork2, client.NetworkRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.CoreV1().Pods(ns).Create(t.Context(),
		sandboxPod("klnet1", testenv.SandboxImage(), []string{"sleep", "infinity"}, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, e, ns, "sbx-klnet1", "Running or Failed", func(p *corev1.Pod) bool {
		return running(p) || p.Status.Phase == corev1.PodFailed
	})
	if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != "kubetest-node" {
		t.Fatalf("pod %s on %q: %s", p.Status.Phase, p.Spec.NodeName, p.Status.Message)
	}
	if code, body := execd(t, p.Status.PodIP, http.MethodGet, "/ping", "", ""); code != http.StatusOK {
		t.Fatalf("execd /ping: %d %s", code, body)
	}
}
