package enforcer

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bpf "github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// EBPFBackendNoAttribution is EBPFBackend with process attribution off; set by
// backend_linux_test.go like EBPFBackend.
var EBPFBackendNoAttribution func(pinRoot string) EBPF

// streamChildEnv makes the test binary a sandbox process that streams: it joins a
// cgroup, enters the sandbox's network namespace, writes to the sink for the given
// milliseconds and prints Gbit/s. Value: cgroup,netns,addr,ms.
const streamChildEnv = "AIRLOCK_STREAM_CHILD"

func streamChildMain() {
	a := strings.Split(os.Getenv(streamChildEnv), ",")
	if err := os.WriteFile(filepath.Join(a[0], "cgroup.procs"), []byte("0"), 0); err != nil {
		fmt.Println("setup", err)
		os.Exit(1)
	}
	ms, _ := strconv.Atoi(a[3])
	var gbps float64
	var cpu time.Duration
	err := dt.Netns{Name: filepath.Base(a[1])}.Do(func() error {
		c, err := net.DialTimeout("tcp", a[2], long)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		var n int64
		cpu0 := benchreport.ProcessCPU()
		defer func() { cpu = benchreport.ProcessCPU() - cpu0 }()
		start := time.Now()
		c.SetWriteDeadline(start.Add(time.Duration(ms) * time.Millisecond))
		for {
			w, err := c.Write(buf)
			n += int64(w)
			if err != nil {
				break
			}
		}
		gbps = float64(n) * 8 / time.Since(start).Seconds() / 1e9
		return nil
	})
	if err != nil {
		fmt.Println("setup", err)
		os.Exit(1)
	}
	fmt.Println(strconv.FormatFloat(gbps, 'f', 4, 64), int64(cpu))
}

// streamFrom runs one TCP stream of d from a process in cgroup cg: Gbit/s, and Gbit
// per CPU-second of the sending process (benchreport.ProcessCPU).
func streamFrom(t *testing.T, tp *dt.Topology, cg string, d time.Duration) (gbps, perCPU float64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), streamChildEnv+"="+strings.Join([]string{cg, tp.Sandbox.Path(),
		netip.AddrPortFrom(dt.Static4, dt.SinkPort).String(), strconv.Itoa(int(d.Milliseconds()))}, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stream child: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("stream child output %q", out)
	}
	g, err := strconv.ParseFloat(f[0], 64)
	cpu, err2 := strconv.ParseInt(f[1], 10, 64)
	if err != nil || err2 != nil || cpu <= 0 {
		t.Fatalf("stream child output %q", out)
	}
	return g, g * d.Seconds() / time.Duration(cpu).Seconds()
}

// TestBenchAttribution measures process attribution (the sock_ops program and the
// per-flow process entries, ebpf.Config.NoAttribution) on vs off, on the eBPF datapath
// and on the nftables datapath (where on loads the socket programs recording only),
// side by side in rounds, each with a freshly loaded datapath warmed up by 200 connects:
// the TCP connect rate of one sandbox process (2000 connects and closes to an allowed
// server; target ≥ 0.95×) and one TCP stream from a sandbox process (target ≥ 0.98×).
// Ratios are the medians of the per-round ratios.
func TestBenchAttribution(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedBPF(t)
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) { benchAttribution(t, mode) })
	}
}

func benchAttribution(t *testing.T, mode Mode) {
	tp := dt.NewTopology(t)
	cg := sandboxCgroup(t)
	root := pinRoot(t)
	if mode == ModeNFTables {
		t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
	}
	policy := basePolicy()
	policy.Rules = append(policy.Rules, datapath.Rule{Prefix: netip.PrefixFrom(dt.Static4, 32), Action: datapath.ActionAllow})
	const id = "sbx-bench-attrib"
	open := func(on bool) datapath.Datapath {
		e := &env{mode: mode, tp: tp, root: root}
		cfg := e.config()
		if !on {
			cfg.EBPF = EBPFBackendNoAttribution(root)
		}
		dp, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		spec := e.spec(id, policy)
		spec.Cgroup = cg
		if err := dp.Attach(spec); err != nil {
			t.Fatal(err)
		}
		return dp
	}
	// The eBPF figures keep their names from before the nftables ones existed.
	prefix, label := "attribution_", ""
	if mode == ModeNFTables {
		prefix, label = "attribution_nftables_", " (nftables)"
	}
	// What attribution adds is CPU work in the connecting process's own context (the
	// sock_ops program runs inside connect(); the TC program's lookup of the flow's
	// process in the softirq of the send). The targets are therefore taken on the
	// CPU-bound figures: connects per CPU-second of the connecting process, and stream
	// Gbit per CPU-second of the sender. The wall-clock figures are printed beside them:
	// on this 2-vCPU machine one connect's wall time is mostly the wakeup of the other
	// vCPU and swings several-fold from round to round, whatever the datapath.
	const rounds, connects, warm, dur = 16, 2000, 200, 1500 * time.Millisecond
	// 2 × 16 × 2200 connects from one address to one server outrun the ephemeral ports
	// while their TIME_WAIT lasts: the sandbox's namespace reuses them (as on a busy
	// host), alike on both sides.
	if err := tp.Sandbox.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	type figs struct{ wallRate, cpuRate, gbps, gbpsCPU []float64 }
	got := map[bool]*figs{false: {}, true: {}}
	var cpuRatio, streamRatio, wallRatio, gbpsRatio, sockops []float64
	if stats, err := bpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer stats.Close()
	}
	for r := range rounds {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			dp := open(on)
			// A freshly loaded datapath's first connects are not its steady state.
			if outcome, _, _ := attemptsCPU(t, tp, cg, "tcp", netip.AddrPortFrom(dt.Static4, 80), warm); outcome != "ok" {
				t.Fatalf("attribution %v: warm-up connect %s", on, outcome)
			}
			sockops0, _ := progRuntime("airlock_sockops")
			outcome, took, cpu := attemptsCPU(t, tp, cg, "tcp", netip.AddrPortFrom(dt.Static4, 80), connects)
			g, gCPU := streamFrom(t, tp, cg, dur)
			if on && mode == ModeEBPF {
				// the kernel's own account of what recording the process costs a
				// connect: the sock_ops program's run time (connects plus the stream's)
				if rt, ok := progRuntime("airlock_sockops"); ok {
					sockops = append(sockops, float64((rt-sockops0).Nanoseconds())/(connects+1))
				}
			}
			dp.Detach(id)
			dp.Close()
			if outcome != "ok" {
				t.Fatalf("attribution %v: connect %s", on, outcome)
			}
			f := got[on]
			f.wallRate = append(f.wallRate, 1/medianDuration(took).Seconds())
			f.cpuRate = append(f.cpuRate, connects/cpu.Seconds())
			f.gbps = append(f.gbps, g)
			f.gbpsCPU = append(f.gbpsCPU, gCPU)
		}
		on, off := got[true], got[false]
		cpuRatio = append(cpuRatio, on.cpuRate[r]/off.cpuRate[r])
		streamRatio = append(streamRatio, on.gbpsCPU[r]/off.gbpsCPU[r])
		wallRatio = append(wallRatio, on.wallRate[r]/off.wallRate[r])
		gbpsRatio = append(gbpsRatio, on.gbps[r]/off.gbps[r])
	}
	for _, on := range []bool{false, true} {
		name, f := map[bool]string{false: "off", true: "on"}[on], got[on]
		benchreport.Value(suite, prefix+name+"_tcp_connects", "median=%.0f per CPU-second, wall %.0f/s at the median connect; rounds=%v", median(f.cpuRate), median(f.wallRate), benchreport.List(f.cpuRate, 2))
		benchreport.Value(suite, prefix+name+"_tcp_stream", "median=%.2f Gbit per CPU-second of the sender, wall %.2f Gbit/s; rounds=%v", median(f.gbpsCPU), median(f.gbps), benchreport.List(f.gbpsCPU, 2))
	}
	if len(sockops) > 0 {
		benchreport.Value(suite, "attribution_sockops_run_time", "median=%.0f ns per connect (the kernel's BPF run-time stats) rounds=%v", median(sockops), benchreport.List(sockops, 2))
	}
	benchreport.Value(suite, prefix+"ratio_rounds", "connects=%s stream=%s", benchreport.List(cpuRatio, 2), benchreport.List(streamRatio, 2))
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label+" (per CPU-second)", median(cpuRatio), "≥", 0.95)
	benchreport.Ratio(suite, "tcp stream attribution on/off"+label+" (per CPU-second)", median(streamRatio), "≥", 0.98)
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label+" (wall clock, median connect)", median(wallRatio), "", 0)
	benchreport.Ratio(suite, "tcp stream attribution on/off"+label+" (wall clock)", median(gbpsRatio), "", 0)
}

// progRuntime is the accumulated run time of the loaded BPF programs named name (the
// kernel counts it while BPF_STATS_RUN_TIME is enabled); false when there is none.
func progRuntime(name string) (time.Duration, bool) {
	var sum time.Duration
	found := false
	for id := bpf.ProgramID(0); ; {
		next, err := bpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := bpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == name {
			if st, err := p.Stats(); err == nil {
				sum += st.Runtime
				found = true
			}
		}
		p.Close()
	}
	return sum, found
}

func medianDuration(v []time.Duration) time.Duration {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
