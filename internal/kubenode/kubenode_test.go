package kubenode

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/airlockdev/airlock/internal/testenv"
)

// toolPod is a pod of the pause image running its network tool (serve or probe).
func toolPod(name string, labels map[string]string, args ...string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name:            "tool",
				Image:           PauseImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         append([]string{"/pause"}, args...),
			}},
		},
	}
}

// logLines returns the last lines of a pod's log, read through the API server
// from the kubelet (pods/log: the API server's kubelet client certificate at work).
func logLines(t *testing.T, n *Node, ns, pod string, lines int64) []string {
	t.Helper()
	raw, err := n.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{TailLines: &lines}).
		DoRaw(context.Background())
	if err != nil {
		t.Fatalf("reading the logs of %s/%s: %v", ns, pod, err)
	}
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

// waitProbes waits until the client's last three attempts all end in want ("open" or
// "blocked").
func waitProbes(t *testing.T, n *Node, ns, pod, want, why string) {
	t.Helper()
	var last []string
	n.Wait(t, "the client's probes to be "+want+" ("+why+")", 60*time.Second, func() (bool, error) {
		last = logLines(t, n, ns, pod, 3)
		if len(last) < 3 {
			return false, nil
		}
		for _, l := range last {
			if f := strings.Fields(l); len(f) < 2 || f[1] != want {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("probes %s (%s): %q", want, why, last)
}

// checkPodRoute checks what egressd relies on to find a pod's veth (ptp CNI): the host's
// route to the pod's address is a /32 without a gateway through a veth of its own.
func checkPodRoute(t *testing.T, pod netip.Addr) {
	t.Helper()
	routes, err := netlink.RouteGetWithOptions(pod.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
	if err != nil || len(routes) != 1 {
		t.Fatalf("route to pod %s: %v %v", pod, routes, err)
	}
	r := routes[0]
	l, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		t.Fatalf("link of the route to pod %s: %v", pod, err)
	}
	if ones, _ := r.Dst.Mask.Size(); ones != 32 || r.Gw != nil || l.Type() != "veth" {
		t.Fatalf("route to pod %s is %s via %v on %s (%s); want a /32 through the pod's own veth", pod, r.Dst, r.Gw, l.Attrs().Name, l.Type())
	}
	t.Logf("pod %s: host route %s on veth %s", pod, r.Dst, l.Attrs().Name)
}

// checkClusterDNS asks the kube-dns Service (through kube-proxy, as a hostNetwork pod with
// dnsPolicy ClusterFirstWithHostNet does) for the kubernetes Service's name.
func checkClusterDNS(t *testing.T) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
	var r *dns.Msg
	var err error
	for range 20 { // the Service's rules may lag the Service by a moment
		if r, _, err = (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(DNSIP, "53")); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("asking the cluster DNS %s: %v", DNSIP, err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("cluster DNS answered %v for kubernetes.default.svc.cluster.local", r.Answer)
	}
	if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != "10.96.0.1" {
		t.Fatalf("cluster DNS answered %v for kubernetes.default.svc.cluster.local, want 10.96.0.1", r.Answer[0])
	}
}

// TestNodeRunsPodsAndEnforcesNetworkPolicy brings the node up, runs a server and a client
// pod on the bridge, shows that a NetworkPolicy denying the server's ingress blocks the
// client and that one allowing it opens the way again, then brings the node down and
// checks that the host is as before.
func TestNodeRunsPodsAndEnforcesNetworkPolicy(t *testing.T) {
	testenv.NeedRoot(t) // before the snapshot, which reads nftables
	before, err := Snapshot()
	if err != nil {
		t.Fatalf("host state before: %v", err)
	}
	n := Start(t)
	ctx := context.Background()

	node, err := n.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", NodeName, err)
	}
	t.Logf("node %s: kubelet %s, runtime %s, addresses %v", node.Name, node.Status.NodeInfo.KubeletVersion,
		node.Status.NodeInfo.ContainerRuntimeVersion, node.Status.Addresses)

	ns := n.Namespace(t, "kubenode")
	pods := n.Client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, toolPod("server", map[string]string{"app": "server"}, "serve", "8080"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the server pod: %v", err)
	}
	server := n.WaitPodRunning(t, ns, "server", 90*time.Second)
	ip, err := netip.ParseAddr(server.Status.PodIP)
	if err != nil || !netip.MustParsePrefix(PodCIDR).Contains(ip) {
		t.Fatalf("server pod IP %q is not in the pod CIDR %s", server.Status.PodIP, PodCIDR)
	}
	if server.Spec.NodeName != NodeName {
		t.Fatalf("server pod scheduled on %q, want %q", server.Spec.NodeName, NodeName)
	}
	checkPodRoute(t, ip)
	checkClusterDNS(t)
	target := net.JoinHostPort(server.Status.PodIP, "8080")
	if _, err := pods.Create(ctx, toolPod("client", map[string]string{"role": "client"}, "probe", target, "300ms"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the client pod: %v", err)
	}
	n.WaitPodRunning(t, ns, "client", 90*time.Second)
	waitProbes(t, n, ns, "client", "open", "no NetworkPolicy yet")

	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	policies := n.Client.NetworkingV1().NetworkPolicies(ns)
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-ingress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := policies.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the deny-ingress NetworkPolicy: %v", err)
	}
	waitProbes(t, n, ns, "client", "blocked", "ingress denied")

	allow, err := policies.Get(ctx, "server-ingress", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
	}}
	if _, err := policies.Update(ctx, allow, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allowing the client: %v", err)
	}
	waitProbes(t, n, ns, "client", "open", "ingress allowed from role=client on 8080")

	// The policy admits the client, not everyone: a pod without the label stays out.
	if _, err := pods.Create(ctx, toolPod("other", map[string]string{"role": "other"}, "probe", target, "300ms"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the other pod: %v", err)
	}
	n.WaitPodRunning(t, ns, "other", 90*time.Second)
	waitProbes(t, n, ns, "other", "blocked", "role=other is not admitted")

	// exec goes from the API server to the kubelet with its client certificate.
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := n.Kubectl(ectx, "-n", ns, "exec", "client", "--", "/pause", "probe", target, "0s", "1")
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out), " open") {
		t.Fatalf("kubectl exec client -- /pause probe %s: %v\n%s", target, err, out)
	}

	// A local Docker image reaches the node without a registry (import-image.sh).
	t.Run("docker-image", func(t *testing.T) {
		img := testenv.NeedSandboxImage(t)
		n.ImportImages(t, img)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{
					Name: "sandbox", Image: img, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "echo from-$(cat /etc/hostname); exec sleep 3600"},
				}},
			},
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating a pod of %s: %v", img, err)
		}
		n.WaitPodRunning(t, ns, "sandbox", 90*time.Second)
		n.Wait(t, "the sandbox pod's output", 30*time.Second, func() (bool, error) {
			return slices.Contains(logLines(t, n, ns, "sandbox", 1), "from-sandbox"), nil
		})
	})

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
	if before.Sysctls["kernel.panic"] == "" {
		t.Fatal("could not read kernel.panic: the sysctl check proved nothing")
	}
}
