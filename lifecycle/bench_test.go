package lifecycle_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/opensandbox"
)

// pingUntilOK polls url every 5 ms until it answers 200 (at most 60 s).
func pingUntilOK(url string, hdr http.Header) error {
	cl := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header = hdr
		resp, err := cl.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s never answered", url)
}

// TestBenchCreateReady: create→ready through Airlock (POST /sandboxes, then the first
// successful execd /ping through the endpoint it gives) next to `docker run -d` of the
// same image with execd bind-mounted as PID 1 plus the first successful /ping at the
// container's address, 20 of each, interleaved.
func TestBenchCreateReady(t *testing.T) {
	testenv.NeedBench(t)
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	execd := lctest.Execd(t)
	hdr := http.Header{"Open-Sandbox-Api-Key": {testKey}}
	const n = 20

	var airlock, docker benchreport.Sample
	airlock.Name, docker.Name = "create_to_ready_airlock", "create_to_ready_docker_run"
	for i := range n {
		t0 := time.Now()
		sb := c.create(map[string]any{
			"image": map[string]any{"uri": h.Image}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"resourceLimits": map[string]string{"cpu": "1", "memory": "512Mi"}, "timeout": 600,
		})
		if err := pingUntilOK(h.HTTP.URL+"/sandboxes/"+sb.ID+"/proxy/44772/ping", hdr); err != nil {
			t.Fatal(err)
		}
		airlock.Latencies = append(airlock.Latencies, time.Since(t0))
		c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")

		name := fmt.Sprintf("%sbench-run-%d-%d", lctest.NamePrefix, os.Getpid(), i)
		t0 = time.Now()
		out, err := exec.Command("docker", "run", "-d", "--name", name, "--network", lctest.Network,
			"-v", execd+":/opt/airlock/execd:ro", "--entrypoint", "/opt/airlock/execd",
			h.Image, "--exec", "--", "tail", "-f", "/dev/null").CombinedOutput()
		if err != nil {
			t.Fatalf("docker run: %v %s", err, out)
		}
		cid := strings.TrimSpace(string(out))
		inst, err := h.Runtime.Inspect(t.Context(), cid)
		if err != nil || !inst.Address.IsValid() {
			t.Fatalf("inspect: %+v %v", inst, err)
		}
		if err := pingUntilOK("http://"+netip.AddrPortFrom(inst.Address, 44772).String()+"/ping", nil); err != nil {
			t.Fatal(err)
		}
		docker.Latencies = append(docker.Latencies, time.Since(t0))
		_ = exec.Command("docker", "rm", "-f", cid).Run()
	}
	for _, s := range []*benchreport.Sample{&airlock, &docker} {
		for _, l := range s.Latencies {
			s.Wall += l
		}
		benchreport.Print("lifecycle", *s)
	}
	benchreport.Ratio("lifecycle", "create_to_ready_p50_airlock_vs_docker_run",
		float64(airlock.Quantile(0.5))/float64(docker.Quantile(0.5)), "≤", 1.15)
	benchreport.Ratio("lifecycle", "create_to_ready_p99_airlock_vs_docker_run",
		float64(airlock.Quantile(0.99))/float64(docker.Quantile(0.99)), "≤", 0)
}

// rssKiB reads VmRSS of pid.
func rssKiB(t *testing.T, pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}

// memAvailableKiB reads MemAvailable from /proc/meminfo.
func memAvailableKiB(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}

// TestBenchIdleSandboxes: 200 idle sandboxes at once under a separate `airlock up`:
// server RSS and host memory per sandbox, then delete them all and show that nothing is
// left (containers, store records).
func TestBenchIdleSandboxes(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedSandboxImage(t)
	const n = 200
	bin := lctest.Airlock(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	prefix := fmt.Sprintf("%sidle%d-", lctest.NamePrefix, os.Getpid())
	cfg := filepath.Join(dir, "airlock.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "listen: %s\nstateDir: %s\nlogLevel: warn\ndocker:\n  network: %s\n  namePrefix: %s\n",
		addr, filepath.Join(dir, "state"), lctest.Network, prefix), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		out, _ := exec.Command("docker", "ps", "-aq", "--filter", "name="+prefix).Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rm", "-f", id).Run()
		}
	})
	p := startUp(t, bin, cfg, addr)
	c := &client{t: t, base: p.url, key: p.key}
	pid := p.cmd.Process.Pid
	rss0 := rssKiB(t, pid)
	mem0 := memAvailableKiB(t)

	var mu sync.Mutex
	ids := make([]string, 0, n)
	create, err := benchreport.MeasureParallel("create_200_idle", 4, n, func() error {
		sb := c.create(map[string]any{
			"image": map[string]any{"uri": testenv.SandboxImage()}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"resourceLimits": map[string]string{"cpu": "100m", "memory": "64Mi"}, "timeout": 3600,
		})
		mu.Lock()
		ids = append(ids, sb.ID)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		c.waitState(id, opensandbox.Running)
	}
	time.Sleep(2 * time.Second) // let the sandboxes settle before measuring memory
	rss1 := rssKiB(t, pid)
	mem1 := memAvailableKiB(t)
	benchreport.Print("lifecycle", create)
	benchreport.Value("lifecycle", "server_rss_idle", "%d MiB before, %d MiB with %d sandboxes (%.1f KiB per sandbox)",
		rss0/1024, rss1/1024, n, float64(rss1-rss0)/n)
	benchreport.Value("lifecycle", "host_memory_per_sandbox", "%.1f MiB (MemAvailable drop %d MiB over %d sandboxes)",
		float64(mem0-mem1)/1024/n, (mem0-mem1)/1024, n)

	del, err := benchreport.MeasureParallel("delete_200_idle", 4, n, func() error {
		mu.Lock()
		id := ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		mu.Unlock()
		c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Print("lifecycle", del)
	var l lifecycle.ListResponse
	_ = json.Unmarshal(c.want("GET", "/v1/sandboxes", nil, http.StatusOK, ""), &l)
	out, _ := exec.Command("docker", "ps", "-aq", "--filter", "name="+prefix).Output()
	left := len(strings.Fields(string(out)))
	// Stop the server to open its store and count the records.
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
	st, err := boltstore.Open(filepath.Join(dir, "state", "lifecycle.db"))
	if err != nil {
		t.Fatal(err)
	}
	records, _ := st.Count()
	st.Close()
	benchreport.Value("lifecycle", "left_after_delete", "%d containers, %d listed, %d store records", left, l.Pagination.TotalItems, records)
	if left != 0 || l.Pagination.TotalItems != 0 || records != 0 {
		t.Errorf("left behind: %d containers, %d listed, %d records", left, l.Pagination.TotalItems, records)
	}
}
