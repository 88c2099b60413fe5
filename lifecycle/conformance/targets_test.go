package conformance_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

func TestMain(m *testing.M) {
	lctest.Network = "altest-conf0"
	code := m.Run()
	kubetest.StopShared()
	lctest.RemoveNetwork(lctest.Network)
	os.Exit(code)
}

// view is what a runtime made of a sandbox, for the checks every runtime must pass.
type view struct {
	Env         map[string]string
	NanoCPUs    int64
	MemoryBytes int64
	// SecondLayer reports whether the runtime's second network layer exists
	// (Kubernetes: the NetworkPolicy; Docker has none and reports true).
	SecondLayer bool
}

// plane is a running control plane of one runtime.
type plane struct {
	c *client
	// restart stops the control plane and starts it again on the same state.
	restart func()
	// objects reports whether the runtime still holds anything of sandbox id.
	objects func(id string) bool
	// inspect returns the runtime's view of sandbox id.
	inspect func(id string) view
}

var limits = lifecycle.Limits{MinTimeout: time.Second}

// targets are the runtimes the suite runs against.
var targets = []struct {
	name  string
	start func(t *testing.T) *plane
}{
	{"docker", startDocker},
	{"kubernetes", startKube},
}

func startDocker(t *testing.T) *plane {
	opts := lctest.Options{APIKey: apiKey, Limits: limits, KeepContainers: true,
		ReapInterval: 200 * time.Millisecond, ResyncInterval: time.Second}
	h := lctest.New(t, opts)
	opts.StateDir = h.StateDir
	t.Cleanup(func() { lctest.RemoveAll(t, h.Runtime) })
	p := &plane{c: &client{t: t, base: h.HTTP.URL}}
	cli := lctest.Docker(t)
	p.restart = func() {
		h.Stop()
		h = lctest.New(t, opts)
		p.c.base = h.HTTP.URL
	}
	find := func(id string) (string, bool) {
		insts, err := h.Runtime.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range insts {
			if in.SandboxID == id {
				return in.ContainerID, true
			}
		}
		return "", false
	}
	p.objects = func(id string) bool { _, ok := find(id); return ok }
	p.inspect = func(id string) view {
		cid, ok := find(id)
		if !ok {
			t.Fatalf("no container for %s", id)
		}
		res, err := cli.ContainerInspect(t.Context(), cid, dockerclient.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v := view{Env: map[string]string{}, SecondLayer: true,
			NanoCPUs: res.Container.HostConfig.NanoCPUs, MemoryBytes: res.Container.HostConfig.Memory}
		for _, kv := range res.Container.Config.Env {
			k, val, _ := strings.Cut(kv, "=")
			v.Env[k] = val
		}
		return v
	}
	return p
}

// kubeReplica starts one control-plane replica on env with the suite's settings.
func kubeReplica(t *testing.T, env *kubetest.Env, sandboxNS, systemNS, identity string) *cluster.ControlPlane {
	t.Helper()
	cp, err := cluster.Start(t.Context(), cluster.Config{
		Kube: env.Config, Listen: "127.0.0.1:0", Namespace: sandboxNS, SystemNamespace: systemNS,
		ExecdImage: "airlock/execd:test", APIKey: apiKey, Identity: identity,
		LeaseDuration: 2 * time.Second, Limits: limits, ReadyTimeout: 60 * time.Second,
		ReapInterval: 200 * time.Millisecond, ResyncInterval: time.Second,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// kubeWorld is an API server with the CRDs, a sandbox and a system namespace, and a
// test kubelet that runs the sandbox pods as real Docker containers.
func kubeWorld(t *testing.T) (env *kubetest.Env, sandboxNS, systemNS string) {
	testenv.NeedSandboxImage(t)
	env = kubetest.Shared(t, kubetest.AirlockCRDs())
	sandboxNS, systemNS = env.Namespace(t, "sbx"), env.Namespace(t, "sys")
	env.RunKubelet(t, kubetest.KubeletConfig{Namespace: sandboxNS, Node: "node-a", ExecdPath: lctest.Execd(t), Network: "altest-confk0"})
	return env, sandboxNS, systemNS
}

func startKube(t *testing.T) *plane {
	env, sandboxNS, systemNS := kubeWorld(t)
	cp := kubeReplica(t, env, sandboxNS, systemNS, "r1")
	t.Cleanup(func() { cp.Close() })
	p := &plane{c: &client{t: t, base: "http://" + cp.Addr.String()}}
	p.restart = func() {
		if err := cp.Close(); err != nil {
			t.Fatal(err)
		}
		cp = kubeReplica(t, env, sandboxNS, systemNS, "r1")
		p.c.base = "http://" + cp.Addr.String()
	}
	pods := env.Client.CoreV1().Pods(sandboxNS)
	p.objects = func(id string) bool {
		ctx := context.Background()
		_, err := pods.Get(ctx, kube.PodName(id), metav1.GetOptions{})
		if err == nil {
			return true
		}
		if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if _, err := env.Client.NetworkingV1().NetworkPolicies(sandboxNS).Get(ctx, kube.PodName(id), metav1.GetOptions{}); err == nil {
			return true
		}
		secs, err := env.Client.CoreV1().Secrets(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "airlock.dev/sandbox-id=" + id})
		if err != nil {
			t.Fatal(err)
		}
		return len(secs.Items) > 0
	}
	p.inspect = func(id string) view {
		pod, err := pods.Get(context.Background(), kube.PodName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == kube.ContainerName })]
		v := view{Env: map[string]string{}}
		for _, e := range c.Env {
			v.Env[e.Name] = e.Value
		}
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			v.NanoCPUs = q.MilliValue() * 1e6
		}
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			v.MemoryBytes = q.Value()
		}
		_, err = env.Client.NetworkingV1().NetworkPolicies(sandboxNS).Get(context.Background(), kube.PodName(id), metav1.GetOptions{})
		v.SecondLayer = err == nil
		return v
	}
	return p
}
