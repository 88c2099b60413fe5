package kubenode

import (
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// nodeCodeInterpreterImage is the code-interpreter image's name in the node: not
// :latest, which kubelet would try to pull (the Kubernetes mode has no image aliases,
// so the suite asks for this name itself: AIRLOCK_TEST_CI_IMAGE).
const nodeCodeInterpreterImage = "airlock/code-interpreter:kubenode"

// nodeBrowserImage is the browser image's name in the node (not :latest, as above).
const nodeBrowserImage = "airlock/browser:kubenode"

// sdkResource is the resource limits of the suites' sandboxes on the node: two of them
// fit beside Airlock on the 2-core one-node cluster (the SDK's default is 1 CPU, 2 GiB).
const sdkResource = `{"cpu":"250m","memory":"512Mi"}`

// TestSDKSuitesOnNode runs the published JavaScript SDK's suites of tests/sdk in the
// harness's external-server mode (tests/sdk/harness.mjs: AIRLOCK_SDK_LIFECYCLE and the
// others) against Airlock deployed on the node by `make kube-up`'s own scripts, from
// this host through the lifecycle API's and the gateway's NodePorts, one deployment for
// every subtest:
//   - sdk: sdk.test.mjs, whose fake internet (allowed.test, denied.test) becomes two
//     headless Services the cluster DNS answers with the same addresses (egressd on
//     the node forwards to the cluster DNS: that is how pods reach the fake resolver),
//     whose warm-pool claim goes to the leading replica's pool (the testnode overlay's)
//     and whose pause/resume goes through a snapshot of the pod on the node;
//   - bypass: egressd's bypass suite from a real pod (checkBypass);
//   - vault: vault.test.mjs, its echo servers in a network namespace routed from this
//     host (not at addresses of the node, which egressd denies once restarted), their
//     certificates from a CA this deployment's egressd trusts
//     (AIRLOCK_KUBE_UPSTREAM_CA), the secrets searched for in the node's egressd
//     folder and the records read from its audit log; its tests that read, restart or
//     reconfigure `airlock up` do so to the node's egressd through egressdControl
//     (AIRLOCK_SDK_CONTROL), whose changes to egressd's DaemonSet are undone before the
//     next subtest;
//   - keys: keys.test.mjs (user keys made through /v1/keys, kept in the cluster store
//     that both lifecycle replicas read);
//   - snapshot: snapshot.test.mjs, the whole snapshot lifecycle on the node (the node's
//     egressd commits through its containerd, restores run there: see
//     TestSnapshotOnNode), its fork of 3 sandboxes (AIRLOCK_SDK_FORK: five do not fit
//     on the 2-core node beside the others);
//   - codeinterpreter: codeinterpreter.test.mjs on the code-interpreter image imported
//     into the node;
//   - browser: browser.test.mjs on the browser image imported into the node (its
//     entrypoint, /opt/airlock/browser.sh, is the image's own: execd's emptyDir sits at
//     lifecycle/kube's ExecdDir, which hides nothing of the image), its two sites a
//     Python server on this host at addresses of the node's bridge, their names
//     headless Services like the others.
func TestSDKSuitesOnNode(t *testing.T) {
	testenv.NeedRoot(t)
	img := testenv.NeedSandboxImage(t)
	n := Start(t)
	tagImage(t, img, nodeSandboxImage)
	// vault.test.mjs's upstream CA, which this deployment's egressd trusts for
	// intercepted upstreams (airlock-up.sh's AIRLOCK_KUBE_UPSTREAM_CA).
	caCert, caKey := sdkUpstreamCA(t)
	t.Setenv("AIRLOCK_KUBE_UPSTREAM_CA", caCert)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Airlock's pods at the end of the failed test:\n%s", podLogs(n, kubedeploy.SystemNamespace, 40))
		}
	})
	a := n.AirlockUp(t, nodeSandboxImage)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + a.API, APIKey: a.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	// The suites' fake names, answered by the cluster DNS with the addresses the suites'
	// own fake resolver gives them.
	ns := n.Namespace(t, "sdkfake")
	names := map[string]string{
		"allowed.test": dnsName(t, n, ns, "allowed", "203.0.113.10"),
		"denied.test":  dnsName(t, n, ns, "denied", "203.0.113.20"),
		"echo.test":    dnsName(t, n, ns, "echo", "203.0.113.180"),
		"plain.test":   dnsName(t, n, ns, "plain", "203.0.113.180"),
	}
	namesJSON, _ := json.Marshal(names)
	external := []string{"AIRLOCK_SDK_LIFECYCLE=" + a.API, "AIRLOCK_SDK_GATEWAY=" + a.Gateway,
		"AIRLOCK_SDK_API_KEY=" + a.APIKey, "AIRLOCK_SDK_RUNTIME=kubernetes", "AIRLOCK_SDK_NAMES=" + string(namesJSON)}

	t.Run("sdk", func(t *testing.T) {
		pool, _ := json.Marshal(map[string]any{"name": poolName, "size": 1, "image": nodeSandboxImage,
			"resource": map[string]string{"cpu": poolCPU, "memory": poolMem}, "domain": leaderAddr(ctx, t, n)})
		out := runSDKSuite(t, "sdk.test.mjs", append(external, "AIRLOCK_SDK_RESOURCE="+sdkResource,
			"AIRLOCK_SDK_POOL="+string(pool), "AIRLOCK_TEST_IMAGE="+nodeSandboxImage)...)
		t.Logf("tests/sdk/sdk.test.mjs on the node:\n%s", suiteSummary(out))
	})
	t.Run("bypass", func(t *testing.T) { checkBypass(ctx, t, n, c) })
	t.Run("vault", func(t *testing.T) {
		forwardFakeInternet(t)
		out := runSDKSuite(t, "vault.test.mjs", append(external, "AIRLOCK_SDK_RESOURCE="+sdkResource,
			"AIRLOCK_TEST_IMAGE="+nodeSandboxImage,
			"AIRLOCK_SDK_UPSTREAM_CA="+caCert, "AIRLOCK_SDK_UPSTREAM_CA_KEY="+caKey,
			"AIRLOCK_SDK_STATE_DIR="+filepath.Join(StateDir, "egressd"),
			"AIRLOCK_SDK_AUDIT_DIR="+filepath.Join(StateDir, "egressd", "audit"),
			"AIRLOCK_SDK_CONTROL="+startControl(t, n))...)
		t.Logf("tests/sdk/vault.test.mjs on the node:\n%s", suiteSummary(out))
	})
	t.Run("keys", func(t *testing.T) {
		out := runSDKSuite(t, "keys.test.mjs", append(external, "AIRLOCK_SDK_RESOURCE="+sdkResource, "AIRLOCK_TEST_IMAGE="+nodeSandboxImage)...)
		t.Logf("tests/sdk/keys.test.mjs on the node:\n%s", suiteSummary(out))
	})
	t.Run("snapshot", func(t *testing.T) {
		out := runSDKSuite(t, "snapshot.test.mjs", append(external, "AIRLOCK_SDK_RESOURCE="+sdkResource,
			"AIRLOCK_TEST_IMAGE="+nodeSandboxImage, "AIRLOCK_SDK_FORK=3")...)
		t.Logf("tests/sdk/snapshot.test.mjs on the node:\n%s", suiteSummary(out))
	})
	t.Run("codeinterpreter", func(t *testing.T) {
		ci := testenv.NeedCodeInterpreterImage(t)
		n.ImportImages(t, ci+"="+nodeCodeInterpreterImage)
		out := runSDKSuite(t, "codeinterpreter.test.mjs", append(external,
			`AIRLOCK_SDK_RESOURCE={"cpu":"1","memory":"1536Mi"}`, "AIRLOCK_TEST_CI_IMAGE="+nodeCodeInterpreterImage)...)
		t.Logf("tests/sdk/codeinterpreter.test.mjs on the node:\n%s", suiteSummary(out))
	})
	t.Run("browser", func(t *testing.T) {
		br := testenv.NeedBrowserImage(t)
		start := time.Now()
		n.ImportImages(t, br+"="+nodeBrowserImage)
		t.Logf("browser image imported into the node in %s", time.Since(start).Round(time.Second))
		// The suite's sites (browser.test.mjs's SITE_A and SITE_B) and its denied name.
		bnames := map[string]string{
			"site-a.test": dnsName(t, n, ns, "site-a", "198.51.100.140"),
			"site-b.test": dnsName(t, n, ns, "site-b", "198.51.100.141"),
			"denied.test": names["denied.test"],
		}
		bnamesJSON, _ := json.Marshal(bnames)
		env := append(slices.Clone(external[:len(external)-1]), "AIRLOCK_SDK_NAMES="+string(bnamesJSON),
			`AIRLOCK_SDK_RESOURCE={"cpu":"1","memory":"1536Mi"}`, "AIRLOCK_BROWSER_IMAGE="+nodeBrowserImage,
			"AIRLOCK_SDK_UPSTREAM_DEV="+Bridge,
			"AIRLOCK_SDK_STATE_DIR="+filepath.Join(StateDir, "egressd"),
			"AIRLOCK_SDK_AUDIT_DIR="+filepath.Join(StateDir, "egressd", "audit"))
		out := runSDKSuite(t, "browser.test.mjs", env...)
		t.Logf("tests/sdk/browser.test.mjs on the node:\n%s", suiteSummary(out))
	})
}

// vaultInternet is the range of vault.test.mjs's upstream servers (HOST_IF's /25: a
// network namespace the suite routes from this host).
const vaultInternet = "203.0.113.128/25"

// forwardFakeInternet accepts, in the node's FORWARD chain (lib.sh's
// AIRLOCK-KUBE-FWD, which otherwise accepts pod-to-pod traffic only; Docker's FORWARD
// policy drops the rest), the traffic between the pods and vaultInternet until t ends
// (down.sh removes the chain anyway).
func forwardFakeInternet(t *testing.T) {
	t.Helper()
	rules := [][]string{{"-s", PodCIDR, "-d", vaultInternet, "-j", "ACCEPT"}, {"-s", vaultInternet, "-d", PodCIDR, "-j", "ACCEPT"}}
	for _, r := range rules {
		if out, err := exec.Command("iptables", append([]string{"-w", "-A", "AIRLOCK-KUBE-FWD"}, r...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables: %v\n%s", err, out)
		}
	}
	t.Cleanup(func() {
		for _, r := range rules {
			_ = exec.Command("iptables", append([]string{"-w", "-D", "AIRLOCK-KUBE-FWD"}, r...)...).Run()
		}
	})
}

// sdkUpstreamCA writes the CA of vault.test.mjs's upstream servers (named
// airlock-sdk-test-ca, as the suite's own) with openssl into a folder of t and returns
// the certificate's and the key's PEM files.
func sdkUpstreamCA(t *testing.T) (cert, key string) {
	t.Helper()
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=airlock-sdk-test-ca").CombinedOutput()
	if err != nil {
		t.Fatalf("openssl: %v\n%s", err, out)
	}
	return cert, key
}

// leaderAddr is the pod address and port of the leading lifecycle replica (the
// Lease's holder), which holds the warm pools.
func leaderAddr(ctx context.Context, t *testing.T, n *Node) string {
	t.Helper()
	lease, err := n.Client.CoordinationV1().Leases(kubedeploy.SystemNamespace).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the lifecycle Lease: %v", err)
	}
	leader, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Get(ctx, *lease.Spec.HolderIdentity, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the leading lifecycle pod %s: %v", *lease.Spec.HolderIdentity, err)
	}
	return net.JoinHostPort(leader.Status.PodIP, "8080")
}

// suiteSummary keeps the lines of node's test runner that name a test's result, a skip
// or the totals.
func suiteSummary(out string) string {
	var summary []string
	for l := range strings.SplitSeq(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "not ok ") || strings.HasPrefix(l, "# ") {
			summary = append(summary, l)
		}
	}
	return strings.Join(summary, "\n")
}
