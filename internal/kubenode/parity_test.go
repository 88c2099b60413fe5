package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// GatewayAuditDir is where the testnode overlay keeps the gateway pods' audit logs on
// the node (a hostPath made by up.sh): <pod name>/audit, its key <pod name>/audit.key.
const GatewayAuditDir = StateDir + "/gateway"

// TestAirlockParityOnNode checks, on Airlock deployed by `make kube-up`'s own scripts,
// what the Kubernetes mode shares with `airlock up` or says plainly it does not:
//   - the operator README's SDK snippet, run as written (readmeSnippet);
//   - (pause and resume are real on the node with snapshots: TestPauseOnNode);
//   - with the node's egressd stopped and its datapath gone, the NetworkPolicy layer
//     alone keeps a sandbox whose policy allows everything from the other sandboxes and
//     the control plane (failClosed), and egressd enforces again once back;
//   - the gateway's audit log, hash-chained and signed, outlives its pods on the node,
//     and `airlock audit verify` checks it with the requests' records in it
//     (gatewayAudit).
func TestAirlockParityOnNode(t *testing.T) {
	n, a, c := deployed(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t.Run("readme-sdk-snippet", func(t *testing.T) { readmeSnippet(t, a) })

	sb := runningSandbox(ctx, t, c, `{"defaultAction":"allow"}`, "tail", "-f", "/dev/null")
	t.Run("fail-closed", func(t *testing.T) { failClosed(ctx, t, n, c, sb) })
	// A sandbox of its own: after failClosed the gateway's kept-alive connections to sb
	// are gone with egressd's flow state (see failClosed).
	t.Run("gateway-audit", func(t *testing.T) {
		gatewayAudit(ctx, t, n, a, c, runningSandbox(ctx, t, c, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null"))
	})
}

// runningSandbox creates a sandbox with policy and entrypoint through the lifecycle API,
// waits until it runs and execd answers through the gateway, and returns its id; it is
// deleted when t ends.
func runningSandbox(ctx context.Context, t *testing.T, c *sdk.Client, policy string, entrypoint ...string) string {
	t.Helper()
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 20 * time.Minute, NetworkPolicy: json.RawMessage(policy),
		Resources: map[string]string{"cpu": "250m", "memory": "256Mi"}, Entrypoint: entrypoint,
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sb.ID) })
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.WaitState(wctx, sb.ID, opensandbox.Running, 250*time.Millisecond); err != nil {
		t.Fatalf("sandbox %s not Running: %v", sb.ID, err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

// runIn runs command in sandbox id through the gateway and returns its stdout lines
// joined by spaces; it fails t after a minute.
func runIn(ctx context.Context, t *testing.T, c *sdk.Client, id, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	x, err := c.Execd(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
	if err != nil {
		t.Fatalf("running %q in %s: %v", command, id, err)
	}
	return strings.Join(ex.Stdout, " ")
}

// readmeSnippet runs the JavaScript of deploy/kubernetes/README.md's step 6 as written,
// with only its placeholders replaced (kubedeploy.SDKSnippet, which `make kube-up`
// prints too): the lifecycle address (the port-forward's 127.0.0.1:8080; here the
// NodePort airlock-up.sh printed), the API key and the image.
func readmeSnippet(t *testing.T, a Airlock) {
	readme, err := os.ReadFile(filepath.Join(ScriptDir(), "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := kubedeploy.SDKSnippet(readme, a.API, a.APIKey, nodeSandboxImage)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(ScriptDir(), "..", "..", "..", "tests", "sdk")
	f := filepath.Join(dir, fmt.Sprintf(".readme-snippet-%d.mjs", os.Getpid()))
	if err := os.WriteFile(f, []byte(js), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f)
	out := runNode(t, dir, []string{filepath.Base(f)})
	if !regexp.MustCompile(`(?m)^hello from \S+$`).MatchString(out) ||
		!regexp.MustCompile(regexp.QuoteMeta(a.Gateway+"/sandboxes/")+`\S+/proxy/44772`).MatchString(out) {
		t.Fatalf("the README's SDK snippet printed %q, want hello from <hostname> and the execd endpoint through the gateway %s", out, a.Gateway)
	}
	t.Logf("the README's SDK snippet against the node:\n%s", out)
}

// failClosed stops the node's egressd (its DaemonSet's nodeSelector matches no node),
// removes what it left enforcing (its pins, which hold the pods' TCX and cgroup links,
// its nftables table and any tc filters on sandbox id's veth) and shows that sandbox id,
// whose policy allows everything, still reaches no other sandbox, no lifecycle pod or
// Service and no API server: the NetworkPolicy refuses them (not egressd's EPERM), while
// an address outside the cluster stays reachable (so egressd is really out of the way).
// egressd is restored after and enforces id again. (Its flow state went with its pins:
// the replies on connections opened before, such as the gateway's kept-alive ones to
// id's execd, are now flows to the denied pod range, which it drops. A restart that
// keeps the pins, as egressd's own, keeps them; callers use a new sandbox after this.)
func failClosed(ctx context.Context, t *testing.T, n *Node, c *sdk.Client, id string) {
	// other's policy allows one name: its NetworkPolicy admits every public address
	// (egressd enforces the names), so while egressd runs other cannot reach the
	// outside address below and once egressd is gone it can: the proof that egressd's
	// datapath is out of the way.
	other := runningSandbox(ctx, t, c, `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}`, "tail", "-f", "/dev/null")
	pods := n.Client.CoreV1().Pods("airlock-sandboxes")
	podIP := func(sid string) string {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "airlock.dev/sandbox-id=" + sid})
		if err != nil || len(l.Items) != 1 || l.Items[0].Status.PodIP == "" {
			t.Fatalf("the pod of %s: %v (%d pods)", sid, err, len(l.Items))
		}
		return l.Items[0].Status.PodIP
	}
	self := podIP(id)
	lc, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=airlock-lifecycle"})
	if err != nil || len(lc.Items) == 0 {
		t.Fatalf("lifecycle pods: %v", err)
	}
	svc, err := n.Client.CoreV1().Services(kubedeploy.SystemNamespace).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	outside := "198.51.100.20" // TEST-NET-2 on the node's bridge: outside every denied range
	if out, err := exec.Command("ip", "addr", "add", outside+"/32", "dev", Bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	defer exec.Command("ip", "addr", "del", outside+"/32", "dev", Bridge).Run()
	open := listen(t, netip.MustParseAddr(outside))

	targets := map[string]string{
		"another sandbox's execd":       podIP(other) + ":44772",
		"a lifecycle pod":               lc.Items[0].Status.PodIP + ":8080",
		"the lifecycle Service":         svc.Spec.ClusterIP + ":8080",
		"the kubernetes Service":        "10.96.0.1:443",
		"the API server on the node":    NodeIP + ":6443",
		"the kubelet on the node":       NodeIP + ":10250",
		"the gateway's NodePort (node)": NodeIP + ":30080",
	}
	probeFrom := func(sid, dst string) string {
		h, p, _ := strings.Cut(dst, ":")
		return runIn(ctx, t, c, sid, fmt.Sprintf(`timeout 4 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>&1 && echo open || echo "blocked rc=$?"`, h, p))
	}

	probe := func(dst string) string { return probeFrom(id, dst) }
	if got := probeFrom(other, open); !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("with egressd running, %s (outside other's policy) from other: %q, want EPERM", open, got)
	}

	// Stop egressd and keep it away.
	ds := n.Client.AppsV1().DaemonSets(kubedeploy.SystemNamespace)
	if _, err := ds.Patch(ctx, "airlock-egressd", types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"nodeSelector":{"airlock.dev/no-node":"true"}}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		if _, err := ds.Patch(context.Background(), "airlock-egressd", types.JSONPatchType,
			[]byte(`[{"op":"remove","path":"/spec/template/spec/nodeSelector/airlock.dev~1no-node"}]`), metav1.PatchOptions{}); err != nil {
			t.Errorf("restoring egressd: %v", err)
		}
	}
	defer restore()
	n.Wait(t, "egressd's pod to go", 2*time.Minute, func() (bool, error) {
		l, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=airlock-egressd"})
		return err == nil && len(l.Items) == 0, err
	})
	veth, otherVeth := vethOf(t, self), vethOf(t, podIP(other))
	cmds := [][]string{{"rm", "-rf", EgressdPinRoot}, {"tc", "qdisc", "del", "dev", veth, "clsact"},
		{"tc", "qdisc", "del", "dev", otherVeth, "clsact"}}
	tables, _ := exec.Command("nft", "list", "tables").Output()
	for l := range strings.SplitSeq(string(tables), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[2] == EgressdNFTTable {
			cmds = append(cmds, []string{"nft", "delete", "table", f[1], f[2]})
		}
	}
	for _, cmd := range cmds {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		t.Logf("%s: %v %s", strings.Join(cmd, " "), err, strings.TrimSpace(string(out)))
	}
	if out, _ := exec.Command("tc", "filter", "show", "dev", veth, "ingress").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("tc filters left on %s (the sandbox's veth) after removing egressd's state:\n%s", veth, out)
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), EgressdNFTTable) {
		t.Fatalf("egressd's nftables table is still there:\n%s", out)
	}

	if got := probeFrom(other, open); got != "open" {
		t.Fatalf("with egressd's state removed, %s (outside other's policy, inside its NetworkPolicy) from other: %q, want open: egressd still enforces", open, got)
	}
	if got := probe(open); got != "open" {
		t.Fatalf("with egressd gone, %s (outside the cluster, allowed by the policy) is %q from the sandbox, want open: the probe cannot show the NetworkPolicy alone", open, got)
	}
	for what, dst := range targets {
		got := probe(dst)
		switch {
		case got == "open":
			t.Errorf("with egressd stopped, %s (%s) is open from a sandbox whose policy allows everything: the NetworkPolicy must refuse it", what, dst)
		case strings.Contains(got, "Operation not permitted"):
			t.Errorf("%s (%s): %q, EPERM from egressd's socket layer, which should be gone", what, dst, got)
		default:
			t.Logf("egressd stopped: %s (%s) from the sandbox: %q", what, dst, got)
		}
	}

	// egressd back: it readopts the sandbox and enforces its policy again.
	restore()
	n.Wait(t, "egressd to enforce the sandbox again", 2*time.Minute, func() (bool, error) {
		resp, err := http.Get("http://" + NodeIP + ":9102/v1/enforced/" + id)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	fresh := runningSandbox(ctx, t, c, `{"defaultAction":"allow"}`, "tail", "-f", "/dev/null")
	if got := probeFrom(fresh, lc.Items[0].Status.PodIP+":8080"); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("with egressd back, a lifecycle pod from a new sandbox: %q, want EPERM from egressd", got)
	}
}

// vethOf returns the host side of the pod veth that routes to addr (the ptp CNI).
func vethOf(t *testing.T, addr string) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "route", "get", addr).CombinedOutput()
	if err != nil {
		t.Fatalf("ip route get %s: %v: %s", addr, err, out)
	}
	m := regexp.MustCompile(` dev (\S+)`).FindStringSubmatch(string(out))
	if m == nil || m[1] == Bridge {
		t.Fatalf("no veth routes to %s: %s", addr, out)
	}
	return m[1]
}

// gatewayAudit sends requests through the gateway's NodePort (with sandbox id's token,
// anonymously and with the API key, which the gateway refuses), deletes the gateway's
// pods so that each closes its log, then checks every pod's log on the node with
// `airlock audit verify` (the shipped image's binary) and finds the records.
func gatewayAudit(ctx context.Context, t *testing.T, n *Node, a Airlock, c *sdk.Client, id string) {
	ep, err := c.Endpoint(ctx, id, opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ep.Endpoint + "/ping"
	send := func(hdr map[string]string) (int, opensandbox.ErrorBody) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var eb opensandbox.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return resp.StatusCode, eb
	}
	const tokened = 3
	for range tokened {
		if st, _ := send(ep.Headers); st != http.StatusOK {
			t.Fatalf("%s with the sandbox's token: HTTP %d, want 200", url, st)
		}
	}
	st, anon := send(nil)
	if st != http.StatusUnauthorized || anon.RequestID == "" {
		t.Fatalf("%s anonymously: HTTP %d %+v, want 401 with a request id", url, st, anon)
	}
	st, keyed := send(map[string]string{opensandbox.HeaderAPIKey: a.APIKey})
	if st != http.StatusUnauthorized && st != http.StatusForbidden {
		t.Fatalf("%s with the API key: HTTP %d, want refused (the public gateway never admits the key)", url, st)
	}

	// The pods go (each closes and seals its log); their logs stay on the node.
	gw, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=airlock-gateway"})
	if err != nil || len(gw.Items) == 0 {
		t.Fatalf("gateway pods: %v", err)
	}
	for _, p := range gw.Items {
		if err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n.Wait(t, "the gateway pods to go", 2*time.Minute, func() (bool, error) {
		for _, p := range gw.Items {
			if _, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
				return false, nil
			}
		}
		return true, nil
	})

	var allowed int
	var anonRec, keyRec *audit.Record
	for _, p := range gw.Items {
		dir := filepath.Join(GatewayAuditDir, p.Name, "audit")
		if _, err := os.Stat(dir + ".pub"); err != nil {
			t.Errorf("gateway pod %s: no signing public key beside its log: %v", p.Name, err)
			continue
		}
		out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network=none", "-v", GatewayAuditDir+":/audit:ro",
			"airlock/airlock:0.1.0", "audit", "verify", "/audit/"+p.Name+"/audit", "--public-key", "/audit/"+p.Name+"/audit.pub").CombinedOutput()
		if err != nil {
			t.Errorf("airlock audit verify of gateway pod %s's log: %v\n%s", p.Name, err, out)
			continue
		}
		// With --public-key every checkpoint and the head must carry a signature that
		// verifies (a log this short may have no checkpoint yet: its head is signed; a
		// replica kube-proxy sent no request to has an empty log, its head signed at seq
		// 0). The records themselves are counted below, across the replicas.
		if !strings.Contains(string(out), "chain:       ok") ||
			!regexp.MustCompile(`signatures:  [1-9]\d* verified|head:        seq \d+, signed`).Match(out) {
			t.Errorf("airlock audit verify of %s: no signed checkpoint or head verified:\n%s", p.Name, out)
		}
		t.Logf("airlock audit verify, gateway pod %s:\n%s", p.Name, strings.TrimSpace(string(out)))
		recs, err := audit.Tail(dir, 1000, audit.Filter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			switch {
			case r.Source == audit.SourceGateway && r.Action == "allow" && r.Extra["status"] == float64(http.StatusOK):
				allowed++
			case r.Extra["request_id"] == anon.RequestID:
				anonRec = &r
			case keyed.RequestID != "" && r.Extra["request_id"] == keyed.RequestID:
				keyRec = &r
			}
		}
	}
	if allowed < tokened {
		t.Errorf("%d allowed records of %s in the gateways' logs, want at least %d", allowed, id, tokened)
	}
	if anonRec == nil || anonRec.Action != "deny" || anonRec.Extra["status"] != float64(http.StatusUnauthorized) {
		t.Errorf("the anonymous request's record (request id %s): %+v, want a deny with status 401", anon.RequestID, anonRec)
	} else {
		b, _ := json.Marshal(anonRec)
		t.Logf("the refused anonymous request's record: %s", b)
	}
	if keyed.RequestID != "" && (keyRec == nil || keyRec.Action != "deny") {
		t.Errorf("the API key request's record (request id %s): %+v, want a deny", keyed.RequestID, keyRec)
	}
	if keyRec != nil && strings.Contains(fmt.Sprint(*keyRec), a.APIKey) {
		t.Errorf("the audit record carries the API key")
	}
}
