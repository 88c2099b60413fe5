// Package kubenode starts the one-node Kubernetes cluster of deploy/kubernetes/testenv
// for the tests that need real pods: kube-apiserver, etcd, kube-controller-manager,
// kube-scheduler, kubelet with a private containerd and ptp CNI, kube-proxy (nftables
// mode), kube-router enforcing NetworkPolicy and CoreDNS. Start runs up.sh and registers down.sh
// for the end of the test; Snapshot and HostState.Diff check that down.sh left the host
// as it found it.
//
// The node is one per host: its names, addresses and folders are fixed (see the
// constants and deploy/kubernetes/testenv/README.md), so callers hold the shared test
// lock (/tmp/airlock-test.lock) as every privileged test does. The API-level tests keep
// using internal/kubetest, which needs no root and starts in 4 s.
package kubenode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockdev/airlock/internal/testenv"
)

// The node's fixed names and places; deploy/kubernetes/testenv/lib.sh is their source.
const (
	StateDir   = "/var/lib/airlock-kube"      // certificates, etcd, kubelet, containerd root, logs
	RunDir     = "/run/airlock-kube"          // containerd's socket and state, pods' netns
	Bridge     = "airlockkube0"               // holds NodeIP (a bridge without ports; pods are ptp veths)
	PodCIDR    = "10.244.0.0/24"              // pod addresses
	NodeIP     = "10.244.0.1"                 // the bridge's address: API server, kubelet, node IP, CoreDNS
	DNSIP      = "10.96.0.10"                 // the kube-dns Service (clusterDNS)
	NodeName   = "localhost"                  // the Node object's name
	PauseImage = "airlock.local/kube-pause:1" // sandbox image; also serve/probe (see testenv/pause)

	// What Airlock's egressd leaves on the host when deployed with the testnode overlay
	// (its flags there); down.sh removes them.
	EgressdPinRoot      = "/sys/fs/bpf/airlock-kube" // --pin-root
	EgressdNFTTable     = "airlockkube"              // --nft-table
	EgressdDNSInterface = "airlockkube-dns"          // --dns-interface
)

// Components are the processes up.sh starts, in start order; their logs are
// StateDir/logs/<component>.log.
var Components = []string{"containerd", "etcd", "kube-apiserver", "kube-controller-manager",
	"kube-scheduler", "kubelet", "kube-proxy", "kube-router", "coredns"}

// KubeUp are the scripts `make kube-up` runs, in order (the Makefile's kube-up recipe,
// which deploy/kubernetes's README test checks against this list): the node (Start) and
// Airlock on it from its manifests (AirlockUp). Tests run exactly these.
var KubeUp = []string{"up.sh", "airlock-up.sh"}

// UpTimeout bounds up.sh: a cold build of the pinned binaries included (see README.md).
const UpTimeout = 35 * time.Minute

// Node is a running one-node cluster.
type Node struct {
	// Kubeconfig is the admin (system:masters) kubeconfig's path.
	Kubeconfig string
	// Config is the admin client configuration read from Kubeconfig.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	dir    string
	down   bool
	logf   func(format string, args ...any) // the test's log, for down.sh's report
}

// ScriptDir is deploy/kubernetes/testenv of this checkout.
func ScriptDir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "deploy", "kubernetes", "testenv")
}

// Start runs up.sh and returns the node once it is Ready; down.sh runs when t ends (after
// the component logs' tails are printed if t failed). It skips without root (fails under
// AIRLOCK_REQUIRE_PRIVILEGED=1) and fails when a node is already up (make kube-down
// first): a test never takes over a developer's cluster.
func Start(t testing.TB) *Node {
	t.Helper()
	testenv.NeedRoot(t)
	if runtime.GOOS != "linux" {
		testenv.SkipOrFail(t, "the one-node cluster runs on Linux only")
	}
	if _, err := os.Stat(StateDir); err == nil {
		t.Fatalf("kubenode: %s exists: a one-node cluster is up or was not brought down; run make kube-down", StateDir)
	}
	n := &Node{dir: ScriptDir(), logf: t.Logf}
	ctx, cancel := context.WithTimeout(context.Background(), UpTimeout)
	defer cancel()
	began := time.Now()
	out, err := n.script(ctx, KubeUp[0])
	if err != nil {
		tails := n.LogTails(30)
		downErr := n.Down()
		t.Fatalf("kubenode: up.sh: %v\n%s\n%s(down.sh after the failed start: %v)", err, out, tails, downErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubenode: component logs at the end of the failed test:\n%s", n.LogTails(40))
		}
		if err := n.Down(); err != nil {
			t.Errorf("kubenode: %v", err)
		}
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	n.Kubeconfig = lines[len(lines)-1]
	t.Logf("kubenode: up in %s, kubeconfig %s", time.Since(began).Round(100*time.Millisecond), n.Kubeconfig)
	if n.Config, err = clientcmd.BuildConfigFromFlags("", n.Kubeconfig); err != nil {
		t.Fatalf("kubenode: reading %s: %v", n.Kubeconfig, err)
	}
	n.Config.QPS, n.Config.Burst = 100, 200
	if n.Client, err = kubernetes.NewForConfig(n.Config); err != nil {
		t.Fatalf("kubenode: %v", err)
	}
	return n
}

// Down runs down.sh (once; later calls return nil) and logs its report to the test. Its
// error carries down.sh's output, which names what it could not remove.
func (n *Node) Down() error {
	if n.down {
		return nil
	}
	n.down = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := n.script(ctx, "down.sh")
	if err != nil {
		return fmt.Errorf("down.sh: %w\n%s", err, out)
	}
	if n.logf != nil {
		n.logf("kubenode: down.sh:\n%s", strings.TrimSpace(out))
	}
	return nil
}

// Airlock is Airlock deployed on the node by AirlockUp: what airlock-up.sh prints.
type Airlock struct {
	// API is the lifecycle API's host:port (the NodePort of airlock-lifecycle-nodeport),
	// the SDK's domain.
	API string
	// Gateway is the gateway's host:port (its NodePort), which sandbox endpoints name.
	Gateway string
	// APIKey is the OPEN-SANDBOX-API-KEY of the installation.
	APIKey string
}

// airlockUpLine matches the lines of airlock-up.sh's banner (deploy/kubernetes/testenv/deploy).
var airlockUpLine = regexp.MustCompile(`(?m)^  (Lifecycle API|Gateway|OPEN-SANDBOX-API-KEY):\s+(?:http://)?(\S+)`)

// AirlockUp deploys Airlock on the node exactly as `make kube-up` does after up.sh: it
// runs airlock-up.sh (images built by deploy/kubernetes/images.sh and imported, the
// testnode overlay applied through internal/kubedeploy, the rollouts waited for) with
// sandboxImage (a local Docker image, not :latest) as AIRLOCK_KUBE_SANDBOX_IMAGE, and
// returns the addresses and the API key its banner prints. It fails t when the script
// fails or a banner line is missing.
func (n *Node) AirlockUp(t testing.TB, sandboxImage string) Airlock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t.Setenv("AIRLOCK_KUBE_SANDBOX_IMAGE", sandboxImage)
	began := time.Now()
	out, err := n.script(ctx, KubeUp[1])
	if err != nil {
		t.Fatalf("kubenode: %s: %v\n%s", KubeUp[1], err, out)
	}
	var a Airlock
	for _, m := range airlockUpLine.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "Lifecycle API":
			a.API = m[2]
		case "Gateway":
			a.Gateway = m[2]
		case "OPEN-SANDBOX-API-KEY":
			a.APIKey = m[2]
		}
	}
	if a.API == "" || a.Gateway == "" || a.APIKey == "" {
		t.Fatalf("kubenode: %s printed no lifecycle API, gateway or API key (%+v):\n%s", KubeUp[1], a, out)
	}
	t.Logf("kubenode: %s in %s: lifecycle API %s, gateway %s", KubeUp[1], time.Since(began).Round(100*time.Millisecond), a.API, a.Gateway)
	return a
}

// ImportImages copies local Docker images into the node's containerd (import-image.sh);
// pods run them with imagePullPolicy Never.
func (n *Node) ImportImages(t testing.TB, refs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := n.script(ctx, "import-image.sh", refs...); err != nil {
		t.Fatalf("kubenode: importing %v: %v\n%s", refs, err, out)
	}
}

// Kubectl runs the node's kubectl (the pinned build up.sh used) with the admin
// kubeconfig and returns its combined output.
func (n *Node) Kubectl(ctx context.Context, args ...string) (string, error) {
	assets, err := os.ReadFile(filepath.Join(StateDir, "assets"))
	if err != nil {
		return "", fmt.Errorf("kubenode: the node's binaries: %w", err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(strings.TrimSpace(string(assets)), "kubectl"),
		append([]string{"--kubeconfig", n.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// script runs one of the testenv scripts and returns its combined output.
func (n *Node) script(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.dir, name), args...)
	// The scripts' folders are the constants above, whatever the caller's environment says.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_KUBE_STATE=") && !strings.HasPrefix(kv, "AIRLOCK_KUBE_RUN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	return out.String(), err
}

// LogTails returns the last lines of every component's log, each under a header; a
// missing log is named as such.
func (n *Node) LogTails(lines int) string {
	var b strings.Builder
	for _, c := range Components {
		data, err := os.ReadFile(filepath.Join(StateDir, "logs", c+".log"))
		if err != nil {
			fmt.Fprintf(&b, "--- %s: no log (%v)\n", c, err)
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", c, len(all), strings.Join(all, "\n"))
	}
	return b.String()
}

// Namespace creates a namespace named from prefix and waits until its default
// ServiceAccount exists (pods are refused before). down.sh removes it with the rest.
func (n *Node) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := n.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubenode: namespace: %v", err)
	}
	n.Wait(t, "the default ServiceAccount of "+ns.Name, 60*time.Second, func() (bool, error) {
		_, err := n.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return ns.Name
}

// Wait polls cond every 250 ms until it returns true, and fails t after timeout (or on
// cond's error) naming what it waited for.
func (n *Node) Wait(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("kubenode: waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubenode: timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// WaitPodRunning waits until pod ns/name is Running with an IP and returns it; a pod
// that fails or stays Pending past timeout fails t with its status and events.
func (n *Node) WaitPodRunning(t testing.TB, ns, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	deadline := time.Now().Add(timeout)
	for {
		p, err := n.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kubenode: pod %s/%s: %v", ns, name, err)
		}
		pod = p
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	var ev strings.Builder
	if list, err := n.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	}); err == nil {
		for _, e := range list.Items {
			fmt.Fprintf(&ev, "  %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	t.Fatalf("kubenode: pod %s/%s not Running with an IP within %s: phase %s, status %+v\nevents:\n%s",
		ns, name, timeout, pod.Status.Phase, pod.Status.ContainerStatuses, ev.String())
	return nil
}
