// Package kubetest starts a real Kubernetes API server (kube-apiserver and etcd on
// loopback, through controller-runtime's envtest) for the tests of the Kubernetes parts.
// The binaries are the pinned ones deploy/kubernetes/testenv/build.sh builds and caches
// by version; there is no kubelet, so a test plays it by writing pod status.
//
// Each Start costs about 4 s; a package shares one environment through Shared.
package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/airlockdev/airlock/internal/testenv"
)

// Pinned versions; deploy/kubernetes/testenv/build.sh builds exactly these.
const (
	KubeVersion = "v1.37.1"
	EtcdVersion = "v3.7.3"
)

// AssetsDir is where build.sh caches the binaries: $AIRLOCK_KUBE_ASSETS, or
// ~/.cache/airlock/kube/<kube>-etcd<etcd>.
func AssetsDir() string {
	if d := os.Getenv("AIRLOCK_KUBE_ASSETS"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "airlock", "kube", KubeVersion+"-etcd"+EtcdVersion)
}

// Env is a running API server with an admin client.
type Env struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	Client kubernetes.Interface
	env    *envtest.Environment
}

// Start starts kube-apiserver and etcd with the CRDs in crdDirs installed (none when
// empty) and stops them when t ends. Missing binaries skip the test (fail under
// AIRLOCK_REQUIRE_PRIVILEGED=1) naming the script that builds them; the inner loop
// (go test -short) skips.
func Start(t testing.TB, crdDirs ...string) *Env {
	t.Helper()
	testenv.NotShort(t, "a kube-apiserver")
	e, err := start(crdDirs)
	if err != nil {
		if os.IsNotExist(err) {
			testenv.SkipOrFail(t, err.Error())
		}
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() { e.Stop() })
	return e
}

var (
	sharedMu  sync.Mutex
	sharedEnv = map[string]*Env{}
)

// Shared is Start for a whole test binary: the first call with a given set of CRD
// folders starts the environment, later calls reuse it. Call Stop from TestMain
// through StopShared.
func Shared(t testing.TB, crdDirs ...string) *Env {
	t.Helper()
	testenv.NotShort(t, "a kube-apiserver")
	key := strings.Join(crdDirs, "\x00")
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if e, ok := sharedEnv[key]; ok {
		return e
	}
	e, err := start(crdDirs)
	if err != nil {
		if os.IsNotExist(err) {
			testenv.SkipOrFail(t, err.Error())
		}
		t.Fatalf("kubetest: %v", err)
	}
	sharedEnv[key] = e
	return e
}

// StopShared stops every environment Shared started (for TestMain).
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for k, e := range sharedEnv {
		e.Stop()
		delete(sharedEnv, k)
	}
}

func start(crdDirs []string) (*Env, error) {
	dir := AssetsDir()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return nil, &os.PathError{Op: "kubetest", Path: filepath.Join(dir, b),
				Err: fmt.Errorf("%w: build it with deploy/kubernetes/testenv/build.sh (make kube-testenv)", os.ErrNotExist)}
		}
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    len(crdDirs) > 0,
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  20 * time.Second,
	}
	// Never a kubectl: envtest only looks it up.
	te.ControlPlane.KubectlPath = "/nonexistent/kubectl"
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("kubetest: linux only")
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", dir, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		te.Stop()
		return nil, err
	}
	return &Env{Config: cfg, Client: cs, env: te}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() {
	if e.env != nil {
		_ = e.env.Stop()
		e.env = nil
	}
}

// InstallCRDs installs CRD objects (for CRDs the test builds in memory) and waits until
// they are served.
func (e *Env) InstallCRDs(t testing.TB, crds ...*apiextv1.CustomResourceDefinition) {
	t.Helper()
	if _, err := envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		t.Fatalf("kubetest: installing CRDs: %v", err)
	}
}

// Namespace creates a namespace with a unique name derived from prefix and deletes
// its objects' namespace when t ends (there is no controller-manager: the namespace
// stays Terminating, which is harmless in a test API server).
func (e *Env) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := e.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// SetPodRunning plays the kubelet: it marks pod ns/name Running and Ready on node with
// address ip (which a test may point at a real container it started).
func (e *Env) SetPodRunning(ctx context.Context, ns, name, node, ip string) error {
	p, err := e.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if node != "" && p.Spec.NodeName == "" {
		// Binding is how a scheduler sets spec.nodeName.
		err := e.Client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("binding pod %s/%s to %s: %w", ns, name, node, err)
		}
		if p, err = e.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	p.Status.HostIP = "127.0.0.1"
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	_, err = e.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// AirlockCRDs is the folder of Airlock's generated CRDs (airlock.dev Sandbox and
// Policy), for Start and Shared.
func AirlockCRDs() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "deploy", "kubernetes", "base", "crds")
}
