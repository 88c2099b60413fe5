package kubenode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// TestFaultsOnNode breaks Airlock on the node, one deployment for every subtest, with a
// sandbox whose policy allows one name (its NetworkPolicy then admits every public
// address: egressd alone keeps it from the outside address probed below):
//   - networkpolicy: the sandbox's NetworkPolicy deleted by hand is back within the
//     leader's resync (lifecycle's ResyncInterval, 10 s by default; the test allows 30 s);
//   - egressd: the node's egressd pod deleted, the sandbox's denied connect fails while
//     the DaemonSet replaces it and after (egressd readopts the sandbox);
//   - leader: the leading lifecycle pod deleted, the other replica takes the Lease, the
//     sandbox is neither lost nor replaced (same pod UID, still Running) and a create
//     works after;
//   - containerd: the node's containerd restarted; the denied connect still fails, the
//     sandbox is Running or Failed (never unenforced) and a create works after.
func TestFaultsOnNode(t *testing.T) {
	n, _, c := deployed(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	sb := runningSandbox(ctx, t, c, `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}`, "tail", "-f", "/dev/null")
	outside := "198.51.100.21" // TEST-NET-2 on the node's bridge: outside every denied range
	if out, err := exec.Command("ip", "addr", "add", outside+"/32", "dev", Bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", outside+"/32", "dev", Bridge).Run() })
	open := listen(t, netip.MustParseAddr(outside))
	h, p, _ := strings.Cut(open, ":")
	probeCmd := fmt.Sprintf(`timeout 4 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>&1 && echo open || echo "blocked rc=$?"`, h, p)
	// denied probes once (an exec that fails on its way through the gateway, as while
	// egressd restarts, is retried: it is no connect) and reports how many execs failed.
	denied := func(when string) (execErrs int) {
		t.Helper()
		for {
			got, err := tryRun(ctx, c, sb, probeCmd)
			if err != nil {
				if execErrs++; execErrs > 60 {
					t.Fatalf("%s: no exec through the gateway for a minute: %v", when, err)
				}
				time.Sleep(time.Second)
				continue
			}
			if !strings.Contains(got, "Operation not permitted") {
				t.Errorf("%s: the denied connect to %s: %q, want EPERM", when, open, got)
			}
			return execErrs
		}
	}
	denied("before the faults")
	sbPods := n.Client.CoreV1().Pods("airlock-sandboxes")
	sel := metav1.ListOptions{LabelSelector: "airlock.dev/sandbox-id=" + sb}
	podUID := func() string {
		l, err := sbPods.List(ctx, sel)
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("the pod of %s: %v (%d pods)", sb, err, len(l.Items))
		}
		return string(l.Items[0].UID)
	}
	uid := podUID()
	sys := kubedeploy.SystemNamespace

	t.Run("networkpolicy", func(t *testing.T) {
		nps := n.Client.NetworkingV1().NetworkPolicies("airlock-sandboxes")
		l, err := nps.List(ctx, sel)
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("the NetworkPolicy of %s: %v (%d)", sb, err, len(l.Items))
		}
		if err := nps.Delete(ctx, l.Items[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		n.Wait(t, "the NetworkPolicy recreated", 30*time.Second, func() (bool, error) {
			l, err := nps.List(ctx, sel)
			return err == nil && len(l.Items) == 1, err
		})
		t.Logf("NetworkPolicy deleted by hand: recreated after %s", time.Since(start).Round(100*time.Millisecond))
		denied("after the NetworkPolicy came back")
	})

	t.Run("egressd", func(t *testing.T) {
		eds := metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=airlock-egressd"}
		l, err := n.Client.CoreV1().Pods(sys).List(ctx, eds)
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("egressd pods: %v (%d)", err, len(l.Items))
		}
		old := l.Items[0].Name
		if err := n.Client.CoreV1().Pods(sys).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		probes, execErrs := 0, 0
		for time.Since(start) < 3*time.Minute {
			execErrs += denied(fmt.Sprintf("%s after egressd's pod was deleted", time.Since(start).Round(100*time.Millisecond)))
			probes++
			l, err := n.Client.CoreV1().Pods(sys).List(ctx, eds)
			if err == nil && len(l.Items) == 1 && l.Items[0].Name != old && ready(&l.Items[0]) {
				t.Logf("egressd replaced (%s Ready) after %s; %d denied connects in between (all EPERM: %v), %d execs failed on the way",
					l.Items[0].Name, time.Since(start).Round(100*time.Millisecond), probes, !t.Failed(), execErrs)
				break
			}
		}
		for i := 0; i < 3; i++ {
			denied("after egressd's restart")
			time.Sleep(time.Second)
		}
	})

	t.Run("leader", func(t *testing.T) {
		lease, err := n.Client.CoordinationV1().Leases(sys).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			t.Fatalf("the lifecycle Lease: %v", err)
		}
		old := *lease.Spec.HolderIdentity
		before, err := c.List(ctx, sdk.ListOptions{PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Client.CoreV1().Pods(sys).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var holder string
		n.Wait(t, "another lifecycle replica leading", 2*time.Minute, func() (bool, error) {
			l, err := n.Client.CoordinationV1().Leases(sys).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				return false, nil
			}
			holder = *l.Spec.HolderIdentity
			return holder != "" && holder != old, nil
		})
		t.Logf("leader %s deleted: %s leads after %s", old, holder, time.Since(start).Round(100*time.Millisecond))
		// Two resyncs of the new leader.
		time.Sleep(25 * time.Second)
		got, err := c.Get(ctx, sb)
		if err != nil || got.Status.State != opensandbox.Running {
			t.Errorf("after the takeover the sandbox is %+v (%v), want Running", got, err)
		}
		if podUID() != uid {
			t.Error("the sandbox's pod was replaced")
		}
		after, err := c.List(ctx, sdk.ListOptions{PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(after.Items) != len(before.Items) {
			t.Errorf("sandboxes %d before the takeover, %d after", len(before.Items), len(after.Items))
		}
		denied("after the takeover")
		start = time.Now()
		nb := runningSandbox(ctx, t, c, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null")
		t.Logf("a create after the takeover: %s Running and execd ready in %s", nb, time.Since(start).Round(100*time.Millisecond))
	})

	// Last, the riskiest: the node's containerd stopped and started again (its shims,
	// and so the pods' containers, outlive it).
	t.Run("containerd", func(t *testing.T) {
		start := time.Now()
		restartContainerd(t)
		t.Logf("containerd restarted in %s", time.Since(start).Round(100*time.Millisecond))
		for i := 0; i < 3; i++ {
			denied("after containerd's restart")
			time.Sleep(time.Second)
		}
		got, err := c.Get(ctx, sb)
		if err != nil || (got.Status.State != opensandbox.Running && got.Status.State != opensandbox.Failed) {
			t.Errorf("after containerd's restart the sandbox is %+v (%v), want Running or Failed", got, err)
		} else {
			t.Logf("after containerd's restart the sandbox is %s", got.Status.State)
		}
		start = time.Now()
		nb := runningSandbox(ctx, t, c, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null")
		t.Logf("a create after containerd's restart: %s Running and execd ready in %s", nb, time.Since(start).Round(100*time.Millisecond))
	})
}

// restartContainerd stops the node's containerd (up.sh's, its pid in StateDir/pids)
// with SIGTERM and starts it again as up.sh does (setsid, the same config and log),
// recording the new pid for down.sh; it waits until its socket answers.
func restartContainerd(t *testing.T) {
	t.Helper()
	pidFile := filepath.Join(StateDir, "pids", "containerd.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stopping containerd %d: %v", pid, err)
	}
	for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("containerd %d still runs 30 s after SIGTERM", pid)
	}
	log, err := os.OpenFile(filepath.Join(StateDir, "logs", "containerd.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("containerd", "--config", filepath.Join(StateDir, "containerd.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Release()
	sock := filepath.Join(RunDir, "containerd", "containerd.sock")
	for i := 0; i < 300; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("containerd's socket %s does not answer 30 s after its start", sock)
}

// ready reports whether every container of pod is ready.
func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// tryRun runs command in sandbox id through the gateway and returns its stdout lines
// joined by spaces, or the error of the exec's way there (bounded by 30 s).
func tryRun(ctx context.Context, c *sdk.Client, id, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	x, err := c.Execd(ctx, id)
	if err != nil {
		return "", err
	}
	ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
	if err != nil {
		return "", err
	}
	return strings.Join(ex.Stdout, " "), nil
}
