package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
)

// benchWrite100MiB writes 100 MiB of incompressible bytes into a sandbox's root
// filesystem, what every snapshot of the snapshot bench captures.
const benchWrite100MiB = "head -c 104857600 /dev/urandom > /root/blob && sync"

// snapshotReady takes a snapshot of sandbox id and polls it every 10 ms until Ready; it
// returns the snapshot's id and the time from POST to Ready.
func (c *client) snapshotReady(id string) (string, time.Duration) {
	c.t.Helper()
	t0 := time.Now()
	var sn lifecycle.Snapshot
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes/"+id+"/snapshots", map[string]any{}, http.StatusAccepted, ""), &sn); err != nil {
		c.t.Fatal(err)
	}
	for time.Since(t0) < 5*time.Minute {
		got := c.getSnapshot(sn.ID)
		switch got.Status.State {
		case lifecycle.SnapshotReady:
			return sn.ID, time.Since(t0)
		case lifecycle.SnapshotFailed:
			c.t.Fatalf("snapshot %s failed: %+v", sn.ID, got.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("snapshot %s not Ready after 5 min", sn.ID)
	return "", 0
}

// createReady creates a sandbox with req and waits for execd's first /ping through the
// server proxy: create→ready as TestBenchCreateReady measures it. It returns the ids
// made (one, or the fork's items).
func (c *client) createReady(req map[string]any, hdr http.Header) []string {
	c.t.Helper()
	var fr lifecycle.ForkResponse
	if err := json.Unmarshal(c.want("POST", "/v1/sandboxes", req, http.StatusAccepted, ""), &fr); err != nil {
		c.t.Fatal(err)
	}
	ids := []string{fr.ID}
	if len(fr.Items) > 0 {
		ids = ids[:0]
		for _, sb := range fr.Items {
			ids = append(ids, sb.ID)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() { errs[i] = pingUntilOK(c.base+"/sandboxes/"+id+"/proxy/44772/ping", hdr) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.t.Fatal(err)
		}
	}
	return ids
}

// TestBenchSnapshot measures snapshots side by side, in one run:
//
//   - snapshot of a sandbox that wrote 100 MiB, POST to Ready, next to `docker commit` of
//     a plain container of the same image (execd as PID 1, like TestBenchCreateReady's)
//     that wrote the same 100 MiB (target ≤ 1.5×);
//   - restore create→ready (first execd /ping) next to a cold create→ready from the
//     image, interleaved (target ≤ 1.2×);
//   - a fork of 10 (airlock.dev/count), create until all ten answer /ping, next to one
//     restore (target ≤ 3×), and next to ten `docker run -d` started together (the
//     host's floor for ten at once; no target).
//
// A missed target is printed, never a failure.
func TestBenchSnapshot(t *testing.T) {
	testenv.NeedBench(t)
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	execd := lctest.Execd(t)
	hdr := http.Header{"Open-Sandbox-Api-Key": {testKey}}
	t.Cleanup(func() { // snapshot images and commits the bench left
		out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})
	del := func(ids ...string) {
		for _, id := range ids {
			c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
		}
	}
	req := func() map[string]any {
		return map[string]any{
			"image": map[string]any{"uri": h.Image}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"resourceLimits": map[string]string{"cpu": "1", "memory": "512Mi"}, "timeout": 600,
		}
	}

	// Snapshot vs docker commit, 3 rounds interleaved; each round a fresh source.
	const rounds = 3
	snap := benchreport.Sample{Name: "snapshot_100MiB_to_ready"}
	commit := benchreport.Sample{Name: "docker_commit_100MiB"}
	var keep string // a snapshot kept for the restore and fork rounds
	for i := range rounds {
		src := c.createReady(req(), hdr)[0]
		c.run(src, benchWrite100MiB)
		id, d := c.snapshotReady(src)
		snap.Latencies = append(snap.Latencies, d)
		del(src)
		if keep == "" {
			keep = id
		} else {
			c.want("DELETE", "/v1/snapshots/"+id, nil, http.StatusNoContent, "")
		}

		name := fmt.Sprintf("%sbench-commit-%d-%d", lctest.NamePrefix, os.Getpid(), i)
		out, err := exec.Command("docker", "run", "-d", "--name", name, "--network", lctest.Network,
			"-v", execd+":/opt/airlock/execd:ro", "--entrypoint", "/opt/airlock/execd",
			h.Image, "--exec", "--", "tail", "-f", "/dev/null").CombinedOutput()
		if err != nil {
			t.Fatalf("docker run: %v %s", err, out)
		}
		cid := strings.TrimSpace(string(out))
		if out, err := exec.Command("docker", "exec", cid, "sh", "-c", benchWrite100MiB).CombinedOutput(); err != nil {
			t.Fatalf("docker exec: %v %s", err, out)
		}
		ref := fmt.Sprintf("airlock-bench-commit:%d-%d", os.Getpid(), i)
		t0 := time.Now()
		if out, err := exec.Command("docker", "commit", cid, ref).CombinedOutput(); err != nil {
			t.Fatalf("docker commit: %v %s", err, out)
		}
		commit.Latencies = append(commit.Latencies, time.Since(t0))
		_ = exec.Command("docker", "rm", "-f", cid).Run()
		_ = exec.Command("docker", "rmi", "-f", ref).Run()
	}
	t.Cleanup(func() { c.do("DELETE", "/v1/snapshots/"+keep, nil) })

	// Restore vs cold create, 10 each interleaved.
	const n = 10
	restore := benchreport.Sample{Name: "restore_create_to_ready"}
	cold := benchreport.Sample{Name: "cold_create_to_ready"}
	restoreReq := func() map[string]any {
		r := req()
		delete(r, "image")
		r["snapshotId"] = keep
		return r
	}
	for range n {
		t0 := time.Now()
		ids := c.createReady(restoreReq(), hdr)
		restore.Latencies = append(restore.Latencies, time.Since(t0))
		del(ids...)
		t0 = time.Now()
		ids = c.createReady(req(), hdr)
		cold.Latencies = append(cold.Latencies, time.Since(t0))
		del(ids...)
	}

	// Fork of 10 vs one restore (the restore sample above), 3 forks.
	fork := benchreport.Sample{Name: "fork_10_create_to_all_ready"}
	for range rounds {
		r := restoreReq()
		r["extensions"] = map[string]string{lifecycle.ExtCount: "10"}
		t0 := time.Now()
		ids := c.createReady(r, hdr)
		fork.Latencies = append(fork.Latencies, time.Since(t0))
		if len(ids) != 10 {
			t.Fatalf("fork of 10 made %d sandboxes", len(ids))
		}
		del(ids...)
	}

	// The host's floor for ten at once: ten `docker run -d` of the image (execd as PID
	// 1) started together, until all ten answer /ping at their address.
	runs := benchreport.Sample{Name: "docker_run_10_parallel_to_all_ready"}
	for i := range rounds {
		t0 := time.Now()
		cids := make([]string, 10)
		errs := make([]error, 10)
		var wg sync.WaitGroup
		for j := range cids {
			wg.Go(func() {
				name := fmt.Sprintf("%sbench-run10-%d-%d-%d", lctest.NamePrefix, os.Getpid(), i, j)
				out, err := exec.Command("docker", "run", "-d", "--name", name, "--network", lctest.Network,
					"-v", execd+":/opt/airlock/execd:ro", "--entrypoint", "/opt/airlock/execd",
					h.Image, "--exec", "--", "tail", "-f", "/dev/null").CombinedOutput()
				if err != nil {
					errs[j] = fmt.Errorf("docker run: %v %s", err, out)
					return
				}
				cids[j] = strings.TrimSpace(string(out))
				inst, err := h.Runtime.Inspect(t.Context(), cids[j])
				if err != nil || !inst.Address.IsValid() {
					errs[j] = fmt.Errorf("inspect: %+v %v", inst, err)
					return
				}
				errs[j] = pingUntilOK("http://"+netip.AddrPortFrom(inst.Address, 44772).String()+"/ping", nil)
			})
		}
		wg.Wait()
		runs.Latencies = append(runs.Latencies, time.Since(t0))
		for _, cid := range cids {
			if cid != "" {
				_ = exec.Command("docker", "rm", "-f", cid).Run()
			}
		}
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	for _, s := range []*benchreport.Sample{&snap, &commit, &restore, &cold, &fork, &runs} {
		for _, l := range s.Latencies {
			s.Wall += l
		}
		benchreport.Print("lifecycle", *s)
	}
	p50 := func(s benchreport.Sample) float64 { return float64(s.Quantile(0.5)) }
	benchreport.Ratio("lifecycle", "snapshot_100MiB_p50_vs_docker_commit", p50(snap)/p50(commit), "≤", 1.5)
	benchreport.Ratio("lifecycle", "restore_p50_vs_cold_create", p50(restore)/p50(cold), "≤", 1.2)
	benchreport.Ratio("lifecycle", "fork_10_p50_vs_one_restore", p50(fork)/p50(restore), "≤", 3)
	benchreport.Ratio("lifecycle", "fork_10_p50_vs_docker_run_10_parallel", p50(fork)/p50(runs), "≤", 0)
}
