package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// nodeSandboxImage is the name the sandbox image gets in the node (airlock-up.sh's
// AIRLOCK_KUBE_SANDBOX_IMAGE): not :latest, which kubelet would try to pull.
const nodeSandboxImage = "airlock/sandbox:kubenode"

// TestAirlockOnNode deploys Airlock on the node from its own manifests by running what
// `make kube-up` runs (Start: up.sh; AirlockUp: airlock-up.sh, which applies the testnode
// overlay through internal/kubedeploy: server-side apply, rollouts of lifecycle's two
// replicas, the gateway and the egressd DaemonSet), then through the
// lifecycle API's NodePort creates a sandbox pod, runs a command in it through the
// gateway and execd, checks that the node's egressd enforces its policy from the
// entrypoint's first instant (an allowed name resolves, another does not, a denied
// connection is refused at once with EPERM by the socket layer on the pod's cgroup and
// audited) and deletes it; checks the transparent L7 check (checkL7) and a warm pool
// claim (checkPool) and the Credential Vault (checkVault); then runs the
// published JS SDK's Kubernetes suite against the NodePorts, and checks the host is
// clean after down.sh.
func TestAirlockOnNode(t *testing.T) {
	testenv.NeedRoot(t)
	img := testenv.NeedSandboxImage(t)
	before, err := Snapshot()
	if err != nil {
		t.Fatalf("host state before: %v", err)
	}
	n := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// Exactly what `make kube-up` runs after up.sh (airlock-up.sh: images.sh, the
	// imports, the testnode overlay through internal/kubedeploy, the rollouts).
	tagImage(t, img, nodeSandboxImage)
	// The Credential Vault check's HTTPS server: its CA, trusted by egressd for
	// intercepted upstreams in this deployment only (airlock-up.sh's
	// AIRLOCK_KUBE_UPSTREAM_CA).
	upstreamCA := trustTestCA(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Airlock's pods at the end of the failed test:\n%s", podLogs(n, kubedeploy.SystemNamespace, 40))
		}
	})
	a := n.AirlockUp(t, nodeSandboxImage)
	api, gw := a.API, a.Gateway

	// Two names the cluster DNS answers (headless Services whose EndpointSlices name
	// TEST-NET-2 addresses, outside every range egressd denies), only one of which the
	// sandbox's policy allows; and a listener of the test on the node's address, which
	// the policy allows by CIDR but egressd's always-deny overlay refuses (the overlay's
	// --deny=10.244.0.0/24, and egressd denies the node's own addresses anyway): the
	// sandbox's NetworkPolicy refuses it too (lifecycle's --deny of the same range), but
	// egressd's socket layer refuses the connect() first, with EPERM, and its audit log
	// must show the flow denied.
	ns := n.Namespace(t, "egress")
	allowedName := dnsName(t, n, ns, "allowed", "198.51.100.7")
	deniedName := dnsName(t, n, ns, "denied", "198.51.100.8")
	denied := listen(t, netip.MustParseAddr(NodeIP))
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q},{"action":"allow","target":"%s/32"}]}`,
		allowedName, NodeIP)

	c, err := sdk.New(sdk.Config{BaseURL: "http://" + api, APIKey: a.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	// The entrypoint's first act is the denied connection, which must be blocked already:
	// execd holds the entrypoint until lifecycle releases it, once the node's egressd
	// reports it enforced. (The pods start without an init container here, the node's
	// execd: egressd attaches once the pod's address is published, while execd holds
	// the entrypoint, so the gate and the hold together make the first instant enforced.)
	dhost, dport, _ := net.SplitHostPort(denied)
	first := fmt.Sprintf(`(timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null && echo open || echo blocked) >/tmp/first-connect; exec tail -f /dev/null`,
		dhost, dport)
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, NetworkPolicy: json.RawMessage(policy),
		Resources: map[string]string{"cpu": "500m", "memory": "256Mi"}, Entrypoint: []string{"bash", "-c", first},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sb.ID) })
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer wcancel()
	if _, err := c.WaitState(wctx, sb.ID, opensandbox.Running, 250*time.Millisecond); err != nil {
		t.Fatalf("sandbox %s not Running: %v", sb.ID, err)
	}
	t.Logf("sandbox %s Running in %s", sb.ID, time.Since(began).Round(100*time.Millisecond))

	// The node's egressd found the pod's veth and enforces the policy.
	resp, err := http.Get("http://" + net.JoinHostPort(NodeIP, "9102") + watch.EnforcedPath + sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("egressd %s%s: HTTP %d, want 200 (enforced)", watch.EnforcedPath, sb.ID, resp.StatusCode)
	}

	ep, err := c.Endpoint(ctx, sb.ID, opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ep.Endpoint, gw+"/") {
		t.Errorf("execd endpoint %q does not go through the gateway %s", ep.Endpoint, gw)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	ex, err := x.Run(ctx, sdk.Command{Command: "echo hello-from-$(cat /etc/hostname)"}, nil)
	if err != nil {
		t.Fatalf("running a command through the gateway: %v", err)
	}
	if len(ex.Stdout) != 1 || !strings.HasPrefix(ex.Stdout[0], "hello-from-") || ex.Stdout[0] == "hello-from-" {
		t.Fatalf("command output %q, want hello-from-<the pod's hostname>", ex.Stdout)
	}
	t.Logf("through the gateway: %q", ex.Stdout)

	run := func(command string) string {
		ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
		if err != nil {
			t.Fatalf("running %q in the sandbox: %v", command, err)
		}
		return strings.Join(ex.Stdout, " ")
	}
	// egressd's DNS filter (the pod's only resolver) answers the allowed name and not
	// the other, which the cluster DNS answers alike (checked from the host).
	if got := run("getent hosts " + allowedName + " || echo unresolved"); !strings.HasPrefix(got, "198.51.100.7 ") {
		t.Errorf("the allowed name %s resolves to %q in the sandbox, want 198.51.100.7", allowedName, got)
	}
	if got := clusterLookup(t, deniedName); got != "198.51.100.8" {
		t.Fatalf("the cluster DNS answers %q for %s, want 198.51.100.8", got, deniedName)
	}
	if got := run("getent hosts " + deniedName + " || echo unresolved"); got != "unresolved" {
		t.Errorf("the name %s outside the policy resolves to %q in the sandbox, want unresolved", deniedName, got)
	}
	if got := run("for i in $(seq 50); do [ -s /tmp/first-connect ] && break; sleep 0.2; done; cat /tmp/first-connect"); got != "blocked" {
		t.Errorf("the entrypoint's first connection to %s was %q, want blocked (entrypoint held until egressd enforces)", denied, got)
	}
	host, port := dhost, dport
	if got := run(fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null && echo open || echo blocked`, host, port)); got != "blocked" {
		t.Errorf("%s (egressd's always-deny overlay) is %q from the sandbox, want blocked", denied, got)
	}
	// egressd's socket layer on the pod's cgroup (found by the pod's UID under kubelet's
	// layout) refuses a denied connect() at once with EPERM, as on Docker; without it
	// the veth filter drops the SYN silently and connect() hangs until the timeout.
	for _, dst := range []string{net.JoinHostPort(host, port), "198.51.100.9:443"} {
		h, p, _ := net.SplitHostPort(dst)
		got := run(fmt.Sprintf(`s=$(date +%%s%%N); timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>&1; echo "rc=$? ms=$(( ($(date +%%s%%N) - s) / 1000000 ))"`, h, p))
		var rc, ms int
		if i := strings.LastIndex(got, "rc="); i < 0 || !strings.Contains(got, "Operation not permitted") {
			t.Errorf("a denied connect() to %s from the pod gave %q, want EPERM (Operation not permitted) from egressd's socket layer", dst, got)
		} else if _, err := fmt.Sscanf(got[i:], "rc=%d ms=%d", &rc, &ms); err != nil || rc == 0 || ms > 1000 {
			t.Errorf("a denied connect() to %s from the pod: %q, want it refused within 1 s", dst, got)
		} else {
			t.Logf("a denied connect() to %s from the pod: %q", dst, got)
		}
	}

	// The denial is egressd's: its audit log on the node has the flow.
	rec := waitAudit(t, n, sb.ID, host, port)
	t.Logf("egressd's audit record of the denied flow: %s", rec)

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	n.Wait(t, "the sandbox's pod to go", 90*time.Second, func() (bool, error) {
		_, err := n.Client.CoreV1().Pods("airlock-sandboxes").Get(ctx, kube.PodName(sb.ID), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// The transparent L7 check (`l7: sni`), through egressd's proxy on the node-local
	// resolver address.
	checkL7(ctx, t, c, allowedName, "198.51.100.7")

	// The warm pool: a held pod claimed with the request's policy enforced before
	// release.
	t.Run("pool", func(t *testing.T) { checkPool(ctx, t, n, a.APIKey, allowedName, denied) })

	// The Credential Vault: the API forwarded to the node's egressd, the CA installed by
	// the trust init container, the credential injected by egressd's L7 proxy.
	t.Run("vault", func(t *testing.T) { checkVault(ctx, t, n, c, upstreamCA, allowedName, "198.51.100.7") })

	// The published JavaScript SDK's Kubernetes suite, from this host as a user of
	// `make kube-up` would run it: the lifecycle API's and the gateway's NodePorts.
	t.Run("sdk", func(t *testing.T) {
		out := runSDKSuite(t, "kube.test.mjs", "AIRLOCK_KUBE_DOMAIN="+api, "AIRLOCK_KUBE_GATEWAY="+gw,
			"AIRLOCK_KUBE_API_KEY="+a.APIKey, "AIRLOCK_TEST_IMAGE="+nodeSandboxImage,
			"AIRLOCK_KUBE_PAUSE=1") // this deployment has snapshots: pause is real
		var summary []string
		for l := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "not ok ") || strings.HasPrefix(l, "# ") {
				summary = append(summary, l)
			}
		}
		t.Logf("tests/sdk/kube.test.mjs on the node:\n%s", strings.Join(summary, "\n"))
	})

	// What the failure needs to be read (an internal error's text is only in the
	// server's log), while the node still runs: the cleanup's dump comes after Down.
	if t.Failed() {
		t.Logf("Airlock's pods before the node goes down:\n%s", podLogs(n, kubedeploy.SystemNamespace, 200))
		t.Logf("the node's components before it goes down:\n%s", n.LogTails(60))
	}
	// down.sh also removes what egressd left on the host (its interface, tables, pins).
	if err := n.Down(); err != nil {
		t.Fatal(err)
	}
	after, err := Snapshot()
	if err != nil {
		t.Fatalf("host state after: %v", err)
	}
	if d := before.Diff(after); len(d) > 0 {
		t.Fatalf("the host is not as before the node:\n  %s", strings.Join(d, "\n  "))
	}
}

// runSDKSuite runs one file of tests/sdk with node's test runner and env added, after
// npm ci when the SDK is not installed; it fails t when the suite fails.
func runSDKSuite(t *testing.T, file string, env ...string) string {
	t.Helper()
	dir := filepath.Join(ScriptDir(), "..", "..", "..", "tests", "sdk")
	return runNode(t, dir, []string{"--test", "--test-concurrency=1", "--test-timeout=600000", file}, env...)
}

// runNode runs node with args in dir (tests/sdk, after npm ci when the SDK is not
// installed there) and env added, and returns its output; it fails t when node fails.
func runNode(t *testing.T, dir string, args []string, env ...string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.SkipOrFail(t, "node is not installed (make prepare installs it)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@alibaba-group", "opensandbox")); err != nil {
		npm := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = dir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s in %s failed on the node: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// tagImage tags the local Docker image img as name (the tag airlock-up.sh imports into
// the node: not :latest, which kubelet would try to pull) until the test ends.
func tagImage(t *testing.T, img, name string) {
	t.Helper()
	if out, err := exec.Command("docker", "tag", img, name).CombinedOutput(); err != nil {
		t.Fatalf("docker tag %s %s: %v\n%s", img, name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", name).Run() })
}

// dnsName creates a headless Service name in ns whose EndpointSlice names addr, and
// returns its fully qualified name, which the cluster DNS answers with addr.
func dnsName(t *testing.T, n *Node, ns, name, addr string) string {
	t.Helper()
	ctx := context.Background()
	port := int32(80)
	if _, err := n.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: port}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fqdn := name + "." + ns + ".svc.cluster.local"
	n.Wait(t, "the cluster DNS to answer "+fqdn, 30*time.Second, func() (bool, error) {
		return clusterLookup(t, fqdn) == addr, nil
	})
	return fqdn
}

// clusterLookup asks the cluster DNS for name's A record from this host ("" when none).
func clusterLookup(t *testing.T, name string) string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(DNSIP, "53"))
	if err != nil || len(r.Answer) == 0 {
		return ""
	}
	if a, ok := r.Answer[0].(*dns.A); ok {
		return a.A.String()
	}
	return ""
}

// waitAudit waits until the node's egressd audit log (the testnode overlay's hostPath)
// has a deny record of sandbox id's flow to host:port, and returns it.
func waitAudit(t *testing.T, n *Node, id, host, port string) string {
	t.Helper()
	var found string
	n.Wait(t, "egressd's audit record of the denied flow to "+net.JoinHostPort(host, port), 60*time.Second, func() (bool, error) {
		files, _ := filepath.Glob(filepath.Join(StateDir, "egressd", "audit", "*.jsonl"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return false, err
			}
			for l := range strings.SplitSeq(string(data), "\n") {
				var r struct {
					SandboxID string `json:"sandbox_id"`
					Source    string `json:"source"`
					DstIP     string `json:"dst_ip"`
					DstPort   int    `json:"dst_port"`
					Action    string `json:"action"`
				}
				if json.Unmarshal([]byte(l), &r) == nil && r.SandboxID == id && r.DstIP == host &&
					fmt.Sprint(r.DstPort) == port && r.Action == "deny" {
					found = l
					return true, nil
				}
			}
		}
		return false, nil
	})
	return found
}

// listen accepts TCP connections on a free port of addr until the test ends and
// returns host:port.
func listen(t *testing.T, addr netip.Addr) string {
	t.Helper()
	l, err := net.Listen("tcp4", net.JoinHostPort(addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

// podLogs returns the status and last lines of every container of the pods in ns.
func podLogs(n *Node, ns string, lines int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := n.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "--- pod %s: %s\n", p.Name, p.Status.Phase)
		for _, c := range p.Spec.Containers {
			raw, err := n.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &lines}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "  %s: %v\n", c.Name, err)
				continue
			}
			fmt.Fprintf(&b, "  %s:\n%s\n", c.Name, raw)
		}
	}
	return b.String()
}
