package execd

import (
	"bufio"
	"bytes"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Metrics is the answer of GET /metrics and each event of /metrics/watch (Metrics in
// execd-api.yaml). CPU and memory are the sandbox's cgroup limits and usage when the
// cgroup tells them, else the machine's.
type Metrics struct {
	CPUCount    float64 `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotalMiB float64 `json:"mem_total_mib"`
	MemUsedMiB  float64 `json:"mem_used_mib"`
	Timestamp   int64   `json:"timestamp"` // Unix milliseconds
}

// metricsSampler computes CPU usage as the difference between two samples of cumulative
// CPU time.
type metricsSampler struct {
	mu       sync.Mutex
	lastCPU  float64 // cumulative CPU seconds
	lastWall time.Time
}

func newMetricsSampler() *metricsSampler {
	m := &metricsSampler{}
	m.lastCPU, _ = cpuSeconds()
	m.lastWall = time.Now()
	return m
}

// sample returns the current metrics; CPU usage covers the time since the previous
// sample (at least 100 ms: a first or too-close call waits for it).
func (m *metricsSampler) sample() Metrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := time.Since(m.lastWall); d < 100*time.Millisecond {
		time.Sleep(100*time.Millisecond - d)
	}
	cpus := cpuCount()
	now := time.Now()
	used, ok := cpuSeconds()
	pct := 0.0
	if ok {
		if wall := now.Sub(m.lastWall).Seconds(); wall > 0 && cpus > 0 {
			pct = (used - m.lastCPU) / wall / cpus * 100
		}
		m.lastCPU, m.lastWall = used, now
	}
	pct = min(max(pct, 0), 100)
	total, usedMem := memory()
	return Metrics{
		CPUCount:    cpus,
		CPUUsedPct:  float64(int(pct*100)) / 100,
		MemTotalMiB: float64(total) / (1 << 20),
		MemUsedMiB:  float64(usedMem) / (1 << 20),
		Timestamp:   now.UnixMilli(),
	}
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.metrics.sample())
}

// handleMetricsWatch streams one Metrics object per second until the client leaves.
func (s *Server) handleMetricsWatch(w http.ResponseWriter, r *http.Request) {
	st := newStream(w)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if !st.sendJSON(s.metrics.sample()) {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// cpuCount is the cgroup CPU quota in CPUs when one is set, else the number of CPUs.
func cpuCount() float64 {
	n := float64(runtime.NumCPU())
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil { // cgroup v2
		f := strings.Fields(string(b))
		if len(f) == 2 && f[0] != "max" {
			q, e1 := strconv.ParseFloat(f[0], 64)
			p, e2 := strconv.ParseFloat(f[1], 64)
			if e1 == nil && e2 == nil && p > 0 {
				return min(n, q/p)
			}
		}
		return n
	}
	q, e1 := readInt("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") // cgroup v1
	p, e2 := readInt("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
	if e1 == nil && e2 == nil && q > 0 && p > 0 {
		return min(n, float64(q)/float64(p))
	}
	return n
}

// cpuSeconds is the cumulative CPU time of the sandbox's cgroup, else of the machine.
func cpuSeconds() (float64, bool) {
	if f, err := os.Open("/sys/fs/cgroup/cpu.stat"); err == nil { // cgroup v2
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
				us, err := strconv.ParseFloat(v, 64)
				return us / 1e6, err == nil
			}
		}
	}
	if ns, err := readInt("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err == nil { // cgroup v1
		return float64(ns) / 1e9, true
	}
	if ns, err := readInt("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"); err == nil {
		return float64(ns) / 1e9, true
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, false
	}
	busy := 0.0
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100, true // USER_HZ is 100 on Linux
}

// memory returns total and used bytes: the cgroup limit and usage (less page cache)
// when a limit is set, else MemTotal and MemTotal-MemAvailable.
func memory() (total, used int64) {
	total, avail := meminfo()
	used = total - avail
	if lim, err := readInt("/sys/fs/cgroup/memory.max"); err == nil { // v2 ("max" fails to parse)
		if cur, err := readInt("/sys/fs/cgroup/memory.current"); err == nil && lim < total {
			return lim, cur - statValue("/sys/fs/cgroup/memory.stat", "inactive_file")
		}
	}
	if lim, err := readInt("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil && lim < total {
		if cur, err := readInt("/sys/fs/cgroup/memory/memory.usage_in_bytes"); err == nil {
			return lim, cur - statValue("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")
		}
	}
	return total, used
}

func meminfo() (total, avail int64) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = kb << 10
		case "MemAvailable":
			avail = kb << 10
		}
	}
	return total, avail
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// statValue reads one "key value" line of a cgroup stat file, 0 when absent.
func statValue(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
