package enforcer

import (
	"bufio"
	"fmt"
	"io"
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
	a := childArgs(streamChildEnv)
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
		childFail(err)
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

// connectLoopEnv makes the test binary a sandbox process that connects on demand: it
// joins a cgroup and enters the sandbox's network namespace, then for each number n
// read from stdin makes n TCP connects and closes to the address and prints "ok" (or
// the last failure), the CPU time and the wall time of the n (ns). Value:
// cgroup,netns,addr.
const connectLoopEnv = "AIRLOCK_CONNECT_LOOP"

func connectLoopMain() {
	a := childArgs(connectLoopEnv)
	err := dt.Netns{Name: filepath.Base(a[1])}.Do(func() error {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			n, err := strconv.Atoi(in.Text())
			if err != nil {
				return err
			}
			outcome := "ok"
			cpu0, start := benchreport.ProcessCPU(), time.Now()
			for range n {
				if o := tryOnce("tcp", a[2]); o != "ok" {
					outcome = o
				}
			}
			wall, cpu := time.Since(start), benchreport.ProcessCPU()-cpu0
			fmt.Println(outcome, int64(cpu), int64(wall))
		}
		return nil
	})
	if err != nil {
		childFail(err)
	}
}

// connectLoop is a running connectLoopMain child.
type connectLoop struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

func startConnectLoop(t *testing.T, tp *dt.Topology, cg string, dst netip.AddrPort) *connectLoop {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), connectLoopEnv+"="+strings.Join([]string{cg, tp.Sandbox.Path(), dst.String()}, ","))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return &connectLoop{in: in, out: bufio.NewScanner(out)}
}

// run makes n connects: the CPU time and wall time they took; it fails t unless all
// succeeded.
func (c *connectLoop) run(t *testing.T, n int) (cpu, wall time.Duration) {
	t.Helper()
	fmt.Fprintln(c.in, n)
	if !c.out.Scan() {
		t.Fatalf("connect loop ended: %v", c.out.Err())
	}
	f := strings.Fields(c.out.Text())
	if len(f) != 3 || f[0] != "ok" {
		t.Fatalf("connect loop: %q", c.out.Text())
	}
	c1, _ := strconv.ParseInt(f[1], 10, 64)
	w1, _ := strconv.ParseInt(f[2], 10, 64)
	return time.Duration(c1), time.Duration(w1)
}

// TestBenchAttribution measures process attribution (the sock_ops program and the
// per-flow process entries, ebpf.Config.NoAttribution) on vs off, on the eBPF datapath
// and on the nftables datapath (where on loads the socket programs recording only).
// Both sides run at once, each a sandbox of its own (a topology, a cgroup, a datapath
// loaded for it, a sandbox process connecting on demand), and take turns in batches
// of 100 connects, so that the host's swings, which move a batch's CPU time by a third
// within seconds on a shared VM, fall on both alike; the sandboxes swap sides every
// round, each round with freshly loaded datapaths warmed up by 200 connects. Figures:
// the TCP connect rate of one sandbox process per CPU-second of it (connects and
// closes to an allowed server; target ≥ 0.95×, the median of the per-turn ratios) and
// a TCP stream of 0.5 s from a sandbox process per CPU-second of the sender (6 pairs a
// round, taking turns likewise; target ≥ 0.98×, the median of the per-pair ratios).
func TestBenchAttribution(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedBPF(t)
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) { benchAttribution(t, mode) })
	}
}

// benchSandbox is one side's sandbox in TestBenchAttribution.
type benchSandbox struct {
	tp   *dt.Topology
	cg   string
	root string
	loop *connectLoop
}

func benchAttribution(t *testing.T, mode Mode) {
	undo, err := pinBench()
	if err != nil {
		t.Fatal(err)
	}
	defer undo()
	dst := netip.AddrPortFrom(dt.Static4, 80)
	var sbx [2]*benchSandbox
	for i := range sbx {
		b := &benchSandbox{tp: dt.NewTopology(t), cg: sandboxCgroup(t), root: pinRoot(t)}
		if mode == ModeNFTables {
			t.Cleanup(func() { nftfilter.RemoveTable(b.tp.Host.Path(), "") })
		}
		// rounds × 2200 connects from one address to one server outrun the ephemeral
		// ports while their TIME_WAIT lasts: the sandbox's namespace reuses them (as on
		// a busy host), alike on both sides.
		if err := b.tp.Sandbox.Do(func() error {
			return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0)
		}); err != nil {
			t.Fatal(err)
		}
		b.loop = startConnectLoop(t, b.tp, b.cg, dst)
		sbx[i] = b
	}
	policy := basePolicy()
	policy.Rules = append(policy.Rules, datapath.Rule{Prefix: netip.PrefixFrom(dt.Static4, 32), Action: datapath.ActionAllow})
	const id = "sbx-bench-attrib"
	open := func(b *benchSandbox, on bool) datapath.Datapath {
		e := &env{mode: mode, tp: b.tp, root: b.root}
		cfg := e.config()
		if !on {
			cfg.EBPF = EBPFBackendNoAttribution(b.root)
		}
		dp, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		spec := e.spec(id, policy)
		spec.Cgroup = b.cg
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
	// vCPU and swings several-fold, whatever the datapath.
	const rounds, turns, batch, warm = 8, 20, 100, 200
	const streams, dur = 6, 500 * time.Millisecond // stream pairs a round, each stream's length
	type figs struct {
		cpu, wall     time.Duration
		connects      int
		gbps, gbpsCPU []float64
		roundCPU      []float64 // per round: connects per CPU-second
	}
	got := map[bool]*figs{false: {}, true: {}}
	var cpuRatio, wallRatio, streamRatio, gbpsRatio, sockops []float64
	if stats, err := bpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer stats.Close()
	}
	for r := range rounds {
		onSide := r % 2 // sbx[onSide] has attribution on this round
		var dps [2]datapath.Datapath
		for i, b := range sbx {
			dps[i] = open(b, i == onSide)
		}
		for _, b := range sbx {
			b.loop.run(t, warm) // a freshly loaded datapath's first connects are not its steady state
		}
		sockops0, _ := progRuntime("airlock_sockops")
		var rc [2]time.Duration
		for k := range turns {
			order := []int{0, 1}
			if k%2 == 1 {
				order = []int{1, 0}
			}
			var cpu, wall [2]time.Duration
			for _, i := range order {
				cpu[i], wall[i] = sbx[i].loop.run(t, batch)
				rc[i] += cpu[i]
			}
			on, off := onSide, 1-onSide
			cpuRatio = append(cpuRatio, cpu[off].Seconds()/cpu[on].Seconds())
			wallRatio = append(wallRatio, wall[off].Seconds()/wall[on].Seconds())
			for i := range sbx {
				f := got[i == onSide]
				f.cpu += cpu[i]
				f.wall += wall[i]
				f.connects += batch
			}
		}
		if mode == ModeEBPF {
			// the kernel's own account of what recording the process costs a connect:
			// the sock_ops program's run time (the on side's only)
			if rt, ok := progRuntime("airlock_sockops"); ok {
				sockops = append(sockops, float64((rt-sockops0).Nanoseconds())/(turns*batch))
			}
		}
		for i := range sbx {
			got[i == onSide].roundCPU = append(got[i == onSide].roundCPU, turns*batch/rc[i].Seconds())
		}
		// Streams in pairs, taking turns like the connects.
		for k := range streams {
			order := []int{0, 1}
			if k%2 == 1 {
				order = []int{1, 0}
			}
			var g, gCPU [2]float64
			for _, i := range order {
				g[i], gCPU[i] = streamFrom(t, sbx[i].tp, sbx[i].cg, dur)
			}
			on, off := onSide, 1-onSide
			streamRatio = append(streamRatio, gCPU[on]/gCPU[off])
			gbpsRatio = append(gbpsRatio, g[on]/g[off])
			for i := range sbx {
				f := got[i == onSide]
				f.gbps = append(f.gbps, g[i])
				f.gbpsCPU = append(f.gbpsCPU, gCPU[i])
			}
		}
		for _, dp := range dps {
			dp.Detach(id)
			dp.Close()
		}
	}
	for _, on := range []bool{false, true} {
		name, f := map[bool]string{false: "off", true: "on"}[on], got[on]
		benchreport.Value(suite, prefix+name+"_tcp_connects", "%.0f per CPU-second, wall %.0f/s (%d connects); rounds=%v",
			float64(f.connects)/f.cpu.Seconds(), float64(f.connects)/f.wall.Seconds(), f.connects, benchreport.List(f.roundCPU, 0))
		benchreport.Value(suite, prefix+name+"_tcp_stream", "median=%.2f Gbit per CPU-second of the sender, wall %.2f Gbit/s (%d streams)", benchreport.Median(f.gbpsCPU), benchreport.Median(f.gbps), len(f.gbps))
	}
	if len(sockops) > 0 {
		benchreport.Value(suite, "attribution_sockops_run_time", "median=%.0f ns per connect (the kernel's BPF run-time stats) rounds=%v", benchreport.Median(sockops), benchreport.List(sockops, 0))
	}
	benchreport.Value(suite, prefix+"ratio_spread", "quartiles of the connect turns %s, of the stream pairs %s", quartiles(cpuRatio), quartiles(streamRatio))
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label+" (per CPU-second)", benchreport.Median(cpuRatio), "≥", 0.95)
	benchreport.Ratio(suite, "tcp stream attribution on/off"+label+" (per CPU-second)", benchreport.Median(streamRatio), "≥", 0.98)
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label+" (all turns' connects per CPU-second)",
		float64(got[true].connects)/got[true].cpu.Seconds()/(float64(got[false].connects)/got[false].cpu.Seconds()), "", 0)
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label+" (wall clock)", benchreport.Median(wallRatio), "", 0)
	benchreport.Ratio(suite, "tcp stream attribution on/off"+label+" (wall clock)", benchreport.Median(gbpsRatio), "", 0)
}

// quartiles formats v's first quartile, median and third quartile.
func quartiles(v []float64) string {
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	return fmt.Sprintf("%.3f / %.3f / %.3f (%d)", v[n/4], v[n/2], v[3*n/4], n)
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
