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
	err := dt.Netns{Name: filepath.Base(a[1])}.Do(func() error {
		c, err := net.DialTimeout("tcp", a[2], long)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		var n int64
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
	fmt.Println(strconv.FormatFloat(gbps, 'f', 4, 64))
}

// streamFrom runs one TCP stream of d from a process in cgroup cg (Gbit/s).
func streamFrom(t *testing.T, tp *dt.Topology, cg string, d time.Duration) float64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), streamChildEnv+"="+strings.Join([]string{cg, tp.Sandbox.Path(),
		netip.AddrPortFrom(dt.Static4, dt.SinkPort).String(), strconv.Itoa(int(d.Milliseconds()))}, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stream child: %v: %s", err, out)
	}
	g, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		t.Fatalf("stream child output %q", out)
	}
	return g
}

// TestBenchAttribution measures process attribution (the sock_ops program and the
// per-flow process entries, ebpf.Config.NoAttribution) on vs off, on the eBPF datapath
// and on the nftables datapath (where on loads the socket programs recording only),
// side by side in rounds, each with a freshly loaded datapath: the TCP connect rate of
// one sandbox process (connect and close to an allowed server; target ≥ 0.95×) and one
// TCP stream from a sandbox process (target ≥ 0.98×). Ratios are the medians of the
// per-round ratios.
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
	const rounds, connects, dur = 9, 500, 2 * time.Second
	rate := map[bool][]float64{}
	gbps := map[bool][]float64{}
	var rateRatio, streamRatio []float64
	for r := range rounds {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			dp := open(on)
			outcome, took := attempts(t, tp, cg, "tcp", netip.AddrPortFrom(dt.Static4, 80), connects)
			g := streamFrom(t, tp, cg, dur)
			dp.Detach(id)
			dp.Close()
			if outcome != "ok" {
				t.Fatalf("attribution %v: connect %s", on, outcome)
			}
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			rate[on] = append(rate[on], float64(connects)/sum.Seconds())
			gbps[on] = append(gbps[on], g)
		}
		rateRatio = append(rateRatio, rate[true][r]/rate[false][r])
		streamRatio = append(streamRatio, gbps[true][r]/gbps[false][r])
	}
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		benchreport.Value(suite, prefix+name+"_tcp_connects", "median=%.0f/s rounds=%v", median(rate[on]), fmtList(rate[on]))
		benchreport.Value(suite, prefix+name+"_tcp_stream", "median=%.2f Gbit/s rounds=%v", median(gbps[on]), fmtList(gbps[on]))
	}
	benchreport.Ratio(suite, "tcp connect rate attribution on/off"+label, median(rateRatio), "≥", 0.95)
	benchreport.Ratio(suite, "tcp stream attribution on/off"+label, median(streamRatio), "≥", 0.98)
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
