package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// The testnode overlay's warm pool (AIRLOCK_POOL): one held pod of the sandbox image
// with limits no other test of the node asks for.
const (
	poolName = "kubenode"
	poolCPU  = "100m"
	poolMem  = "128Mi"
)

// checkPool claims the testnode overlay's warm pool member on the node: the leading
// lifecycle replica (the Lease's holder, which holds the pools) serves a create with the
// pool's image and limits from its held pod, with the request's policy, env and
// entrypoint. The entrypoint's first acts show the request's policy was enforced
// before execd released it: the allowed name resolves (the member's deny-all would not
// answer it) and a connection to denied (host:port, refused by egressd's operator
// overlay) fails at once with EPERM. Afterwards the pool is refilled with a new pod.
func checkPool(ctx context.Context, t *testing.T, n *Node, apiKey, allowedName, denied string) {
	t.Helper()
	lease, err := n.Client.CoordinationV1().Leases(kubedeploy.SystemNamespace).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the lifecycle Lease: %v", err)
	}
	leader, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Get(ctx, *lease.Spec.HolderIdentity, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the leading lifecycle pod %s: %v", *lease.Spec.HolderIdentity, err)
	}
	base := "http://" + net.JoinHostPort(leader.Status.PodIP, "8080")
	metric := func(name string) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
		req.Header.Set(opensandbox.HeaderAPIKey, apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for l := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(l, name+" ") {
				return strings.TrimPrefix(l, name+" ")
			}
		}
		return ""
	}
	readyMetric := fmt.Sprintf(`airlock_lifecycle_pool_members{pool=%q,state="ready"}`, poolName)
	n.Wait(t, "the warm pool member to be ready on the leader "+leader.Name, 3*time.Minute, func() (bool, error) {
		return metric(readyMetric) == "1", nil
	})
	// The member: the one sandbox pod left once the earlier checks' pods are gone.
	member := ""
	n.Wait(t, "the pool member to be the only sandbox pod", 90*time.Second, func() (bool, error) {
		pods, err := n.Client.CoreV1().Pods("airlock-sandboxes").List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		member = pods.Items[0].Name
		return true, nil
	})

	c, err := sdk.New(sdk.Config{BaseURL: base, APIKey: apiKey})
	if err != nil {
		t.Fatal(err)
	}
	dhost, dport, _ := net.SplitHostPort(denied)
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, allowedName)
	first := fmt.Sprintf(`{ echo "env=$POOL_TEST"; getent hosts %s || echo unresolved; timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>&1 && echo open || echo blocked; } >/tmp/first 2>&1; exec tail -f /dev/null`,
		allowedName, dhost, dport)
	began := time.Now()
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, NetworkPolicy: json.RawMessage(policy),
		Env:       map[string]string{"POOL_TEST": "claimed"},
		Resources: map[string]string{"cpu": poolCPU, "memory": poolMem}, Entrypoint: []string{"bash", "-c", first},
	})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("create from the pool: %v", err)
	}
	defer func() { _ = c.Kill(context.Background(), sb.ID) }()
	if kube.PodName(sb.ID) != member {
		t.Fatalf("the create made sandbox %s, not the pool member's pod %s (served cold?)", sb.ID, member)
	}
	if sb.Status.State != opensandbox.Running {
		t.Errorf("a claimed sandbox answered %s, want Running at once", sb.Status.State)
	}
	if got := metric(fmt.Sprintf(`airlock_lifecycle_pool_claims_total{pool=%q}`, poolName)); got != "1" {
		t.Errorf("pool_claims_total %q, want 1", got)
	}
	t.Logf("pool: create claimed member %s, Running in %s", member, took.Round(time.Millisecond))

	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	ex, err := x.Run(ctx, sdk.Command{Command: "for i in $(seq 50); do grep -qe blocked -e open /tmp/first 2>/dev/null && break; sleep 0.2; done; cat /tmp/first"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(ex.Stdout, "\n")
	t.Logf("pool: the entrypoint's first acts:\n%s", got)
	if !strings.Contains(got, "env=claimed") {
		t.Errorf("the claimed sandbox's entrypoint did not get the request's env: %q", got)
	}
	if !strings.Contains(got, "198.51.100.7") {
		t.Errorf("the allowed name %s did not resolve for the entrypoint (the request's policy not in force at release): %q", allowedName, got)
	}
	if !strings.Contains(got, "Operation not permitted") || !strings.Contains(got, "blocked") {
		t.Errorf("the entrypoint's connection to %s: %q, want EPERM (Operation not permitted)", denied, got)
	}

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	n.Wait(t, "the pool to be refilled", 3*time.Minute, func() (bool, error) {
		return metric(readyMetric) == "1", nil
	})
}
