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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// benchPoll is how often the node benchmarks poll for the state they time.
const benchPoll = 5 * time.Millisecond

// TestBenchNode measures Airlock on the one-node cluster, one deployment (up.sh and
// airlock-up.sh, as `make kube-up`) for all figures, printed as BENCH/RATIO lines
// (internal/benchreport) and never failing on a missed target:
//
//   - cold create→ready: POST /sandboxes (limits the warm pool does not hold) until
//     execd answers /ping through the gateway and a first command runs there, next to
//     a bare pod of the same image created through the API server until Running and a
//     first `kubectl exec` succeeds; n=5 each, alternating;
//   - pooled create→ready: the same against the leading replica with the warm pool's
//     limits, so each create claims the held member (p50 target ≤ 50 ms); n=5, each
//     after the pool is refilled;
//   - policy PUT→enforced: PUT /sandboxes/{id}/policy until the node's egressd reports
//     the new version enforced on its status route (watch.EnforcedPath), then a
//     connect() from the pod is checked to reflect the last version (p99 target ≤
//     100 ms); n=20, alternating a policy that denies an address and one that allows it.
func TestBenchNode(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedRoot(t)
	img := testenv.NeedSandboxImage(t)
	n := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	tagImage(t, img, nodeSandboxImage)
	a := n.AirlockUp(t, nodeSandboxImage)
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + a.API, APIKey: a.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	ns := n.Namespace(t, "bench")

	// Cold create→ready, alternating with bare pods.
	const nCold = 5
	airlock := benchreport.Sample{Name: "cold_create_to_ready_airlock"}
	bare := benchreport.Sample{Name: "cold_create_to_ready_bare_pod"}
	airlockPod := benchreport.Sample{Name: "cold_create_to_pod_running_airlock"}
	bareRun := benchreport.Sample{Name: "cold_create_to_pod_running_bare_pod"}
	for i := range nCold {
		var running time.Duration
		ph := newPhases(time.Now())
		d, err := airlockReady(ctx, n, c, sdk.CreateRequest{
			Image: nodeSandboxImage, Timeout: 10 * time.Minute, Entrypoint: []string{"tail", "-f", "/dev/null"},
			Resources: map[string]string{"cpu": "200m", "memory": "192Mi"},
		}, nil, &running, ph)
		if err != nil {
			t.Fatalf("airlock cold create %d: %v", i, err)
		}
		t.Logf("cold %d phases: %s", i, ph)
		airlock.Latencies = append(airlock.Latencies, d)
		airlockPod.Latencies = append(airlockPod.Latencies, running)
		var bareRunning time.Duration
		if d, err = barePodReady(ctx, n, ns, fmt.Sprintf("bare-%d", i), &bareRunning); err != nil {
			t.Fatalf("bare pod %d: %v", i, err)
		}
		bare.Latencies = append(bare.Latencies, d)
		bareRun.Latencies = append(bareRun.Latencies, bareRunning)
	}
	printSamples(&airlock, &airlockPod, &bare, &bareRun)
	benchreport.Ratio("kubenode", "cold_create_to_ready_p50_airlock_vs_bare_pod",
		float64(airlock.Quantile(0.5))/float64(bare.Quantile(0.5)), "≤", 1.2)

	// Pooled create→ready: creates with the pool's image and limits, served by the
	// leading replica (the one holding the pool).
	leader := leaderURL(ctx, t, n)
	lc, err := sdk.New(sdk.Config{BaseURL: leader, APIKey: a.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	readyMetric := fmt.Sprintf(`airlock_lifecycle_pool_members{pool=%q,state="ready"}`, poolName)
	claimsMetric := fmt.Sprintf(`airlock_lifecycle_pool_claims_total{pool=%q}`, poolName)
	const nPool = 5
	pooled := benchreport.Sample{Name: "pooled_create_to_ready"}
	pooledAnswer := benchreport.Sample{Name: "pooled_create_answer_running"}
	for i := range nPool {
		var answered time.Duration
		ph := newPhases(time.Now())
		n.Wait(t, "the warm pool member to be ready", 3*time.Minute, func() (bool, error) {
			return metricValue(ctx, leader, a.APIKey, readyMetric) == "1", nil
		})
		before := metricValue(ctx, leader, a.APIKey, claimsMetric)
		d, err := airlockReady(ctx, n, lc, sdk.CreateRequest{
			Image: nodeSandboxImage, Timeout: 10 * time.Minute, Entrypoint: []string{"tail", "-f", "/dev/null"},
			Resources: map[string]string{"cpu": poolCPU, "memory": poolMem},
		}, &answered, nil, ph)
		if err != nil {
			t.Fatalf("pooled create %d: %v", i, err)
		}
		t.Logf("pooled %d phases: %s", i, ph)
		if after := metricValue(ctx, leader, a.APIKey, claimsMetric); after == before {
			t.Fatalf("pooled create %d was served cold (pool_claims_total stayed %q)", i, after)
		}
		pooled.Latencies = append(pooled.Latencies, d)
		pooledAnswer.Latencies = append(pooledAnswer.Latencies, answered)
	}
	printSamples(&pooledAnswer, &pooled)
	benchreport.Value("kubenode", "pooled_create_to_ready_p50", "%s (target ≤ 50ms)", pooled.Quantile(0.5).Round(100*time.Microsecond))

	// Policy PUT → enforced on the pod's node.
	benchPolicy(ctx, t, c)
}

// airlockReady creates a sandbox with r through c, waits until its execd answers /ping
// through the gateway (polling every benchPoll) and a first command runs, deletes it and
// returns the time from the create to the command's answer. The deletion waits until
// the sandbox's pod is gone, so one measurement does not overlap the next.
//
// answered, when not nil, gets the time the create took to answer; running, when not
// nil, gets the time from the create to the sandbox's pod reported
// Running by the API server (polled every benchPoll alongside), which splits the
// figure into the pod's start (its init containers included) and what follows (the
// egress gate, the release, the gateway's route).
func airlockReady(ctx context.Context, n *Node, c *sdk.Client, r sdk.CreateRequest, answered, running *time.Duration, ph *phases) (time.Duration, error) {
	t0 := time.Now()
	if ph != nil {
		ph.t0 = t0
	}
	sb, err := c.Create(ctx, r)
	if err != nil {
		return 0, err
	}
	if answered != nil {
		*answered = time.Since(t0)
	}
	if ph != nil {
		ph.now("create.answered")
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		done := ph.watchPod(wctx, n.Client, "airlock-sandboxes", kube.PodName(sb.ID))
		defer func() { wcancel(); <-done }()
	}
	polled := make(chan struct{})
	pctx, stop := context.WithCancel(ctx)
	go func() {
		defer close(polled)
		for running != nil && pctx.Err() == nil {
			p, err := n.Client.CoreV1().Pods("airlock-sandboxes").Get(pctx, kube.PodName(sb.ID), metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				*running = time.Since(t0)
				return
			}
			time.Sleep(benchPoll)
		}
	}()
	defer func() { stop(); <-polled }()
	defer func() {
		_ = c.Kill(context.Background(), sb.ID)
		for range 600 {
			_, err := n.Client.CoreV1().Pods("airlock-sandboxes").Get(context.Background(), kube.PodName(sb.ID), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(wctx, 2*time.Second)
		err := x.Ping(pctx)
		pcancel()
		if err == nil {
			if ph != nil {
				ph.now("client.ping")
			}
			break
		}
		select {
		case <-wctx.Done():
			return 0, fmt.Errorf("execd of %s never answered: %w", sb.ID, err)
		case <-time.After(benchPoll):
		}
	}
	if _, err := x.Run(ctx, sdk.Command{Command: "true"}, nil); err != nil {
		return 0, fmt.Errorf("first command in %s: %w", sb.ID, err)
	}
	d := time.Since(t0)
	if ph != nil {
		ph.mark("client.command", d)
		ph.lifecycleEvents(ctx, c, sb.ID)
	}
	return d, nil
}

// barePodReady creates a pod of the node's sandbox image in ns through the API server,
// polls until it is Running (every benchPoll) and a first `kubectl exec -- true`
// succeeds, deletes it and returns the time from the create to the exec's end.
func barePodReady(ctx context.Context, n *Node, ns, name string, running *time.Duration) (time.Duration, error) {
	zero := int64(0)
	pods := n.Client.CoreV1().Pods(ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "sandbox", Image: nodeSandboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"tail", "-f", "/dev/null"},
			}},
		},
	}
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	defer func() {
		_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		for range 600 {
			if _, err := pods.Get(context.Background(), name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			*running = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("pod %s not Running: %v", name, err)
		}
		time.Sleep(benchPoll)
	}
	for {
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := n.Kubectl(ectx, "-n", ns, "exec", name, "--", "true")
		cancel()
		if err == nil {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("kubectl exec %s: %v", name, err)
		}
		time.Sleep(benchPoll)
	}
}

// benchPolicy times PUT /sandboxes/{id}/policy until the node's egressd reports the
// new version enforced (watch.EnforcedPath on its status listener, polled every
// millisecond while the PUT is in flight), and until the PUT answers, 20 times, alternating a policy that denies 198.51.100.9 and one that
// allows it; then checks that a connect() from the pod reflects the last one.
func benchPolicy(ctx context.Context, t *testing.T, c *sdk.Client) {
	t.Helper()
	deny := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"198.51.100.7/32"}]}`)
	allow := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"198.51.100.7/32"},{"action":"allow","target":"198.51.100.9/32"}]}`)
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, Entrypoint: []string{"tail", "-f", "/dev/null"},
		Resources: map[string]string{"cpu": "200m", "memory": "192Mi"}, NetworkPolicy: deny,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Kill(context.Background(), sb.ID) }()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.WaitState(wctx, sb.ID, opensandbox.Running, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	status := "http://" + net.JoinHostPort(NodeIP, "9102") + watch.EnforcedPath + sb.ID
	enforced := func() uint64 {
		resp, err := http.Get(status)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		var e watch.Enforced
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&e) != nil {
			return 0
		}
		return e.PolicyVersion
	}
	const nPut = 20
	put := benchreport.Sample{Name: "policy_put_to_enforced"}
	answer := benchreport.Sample{Name: "policy_put_answer"}
	for i := range nPut {
		doc := allow
		if i%2 == 1 {
			doc = deny
		}
		// egressd is polled while the PUT is in flight: lifecycle answers once the node
		// confirms, but the node may enforce the change before the answer.
		prev := enforced()
		t0 := time.Now()
		seen := make(chan time.Duration, 1)
		go func() {
			for time.Since(t0) < 30*time.Second {
				if enforced() > prev {
					seen <- time.Since(t0)
					return
				}
				time.Sleep(time.Millisecond)
			}
			seen <- 0
		}()
		p, err := c.SetPolicy(ctx, sb.ID, doc)
		if err != nil {
			t.Fatalf("PUT policy %d: %v", i, err)
		}
		answer.Latencies = append(answer.Latencies, time.Since(t0))
		d := <-seen
		if d == 0 {
			t.Fatalf("egressd never reported a version of %s's policy after %d enforced", sb.ID, prev)
		}
		if v := enforced(); v < p.Version {
			t.Fatalf("egressd reports version %d of %s's policy enforced after the PUT answered %d", v, sb.ID, p.Version)
		}
		put.Latencies = append(put.Latencies, d)
	}
	// Where the time goes: lifecycle's PolicyEnforced events give the gate's share (from
	// handing the change to the runtime's second layer to egressd's confirmation).
	if d, err := c.Diagnostics(ctx, sb.ID, opensandbox.DiagnosticEvents, sdk.DiagnosticOptions{Scope: "network", Delivery: "inline"}); err != nil {
		t.Logf("the sandbox's network events: %v", err)
	} else if text, err := c.DiagnosticText(ctx, d); err == nil {
		var lines []string
		for l := range strings.SplitSeq(text, "\n") {
			if strings.Contains(l, "PolicyEnforced") || strings.Contains(l, "enforced after") {
				lines = append(lines, l)
			}
		}
		t.Logf("lifecycle's PolicyEnforced events (%d):\n%s", len(lines), strings.Join(lines[max(0, len(lines)-5):], "\n"))
	}
	// The last PUT (i=19) denies 198.51.100.9: a connect() from the pod fails at once
	// with EPERM, so the version egressd reports is the one the pod's traffic meets.
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := x.Run(ctx, sdk.Command{Command: `timeout 3 bash -c 'exec 3<>/dev/tcp/198.51.100.9/443' 2>&1; echo rc=$?`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ex.Stdout, " "); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("after the last PUT (deny 198.51.100.9) a connect() from the pod gave %q, want EPERM", got)
	}
	printSamples(&answer, &put)
	benchreport.Value("kubenode", "policy_put_to_enforced_p99", "%s (target ≤ 100ms; until egressd's %s reports the version)",
		put.Quantile(0.99).Round(100*time.Microsecond), watch.EnforcedPath)
}

// printSamples sets each sample's wall time to the sum of its latencies and prints it.
func printSamples(ss ...*benchreport.Sample) {
	for _, s := range ss {
		s.Wall = 0
		for _, l := range s.Latencies {
			s.Wall += l
		}
		benchreport.Print("kubenode", *s)
	}
}

// leaderURL returns the base URL of the lifecycle replica holding the Lease (the one
// holding and claiming the warm pools), at its pod address.
func leaderURL(ctx context.Context, t *testing.T, n *Node) string {
	t.Helper()
	lease, err := n.Client.CoordinationV1().Leases(kubedeploy.SystemNamespace).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the lifecycle Lease: %v", err)
	}
	leader, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Get(ctx, *lease.Spec.HolderIdentity, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the leading lifecycle pod %s: %v", *lease.Spec.HolderIdentity, err)
	}
	return "http://" + net.JoinHostPort(leader.Status.PodIP, "8080")
}

// metricValue returns the value of the metric line named name (labels included) of the
// lifecycle replica at base, "" when absent or unreachable.
func metricValue(ctx context.Context, base, apiKey, name string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	req.Header.Set(opensandbox.HeaderAPIKey, apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}
