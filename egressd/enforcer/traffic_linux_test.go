package enforcer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/internal/testenv"
)

const (
	short   = 700 * time.Millisecond // how long a dropped connection attempt may take
	long    = 5 * time.Second
	nflogGr = 161
)

var backends = []Mode{ModeEBPF, ModeNFTables}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		childMain()
		return
	}
	if os.Getenv(connectChildEnv) != "" {
		connectChildMain()
		return
	}
	if os.Getenv(connectLoopEnv) != "" {
		connectLoopMain()
		return
	}
	if os.Getenv(streamChildEnv) != "" {
		streamChildMain()
		return
	}
	os.Exit(m.Run())
}

// env is one backend under test in a fresh topology.
type env struct {
	mode Mode
	tp   *dt.Topology
	root string // eBPF pin root
	dp   datapath.Datapath
}

// EBPFBackend returns the eBPF backend pinned under pinRoot. backend_linux_test.go
// (package enforcer_test) sets it from internal/ebpftest: no package under egressd/
// imports ebpf/, test packages included, so the tests here see only the EBPF
// interface.
var EBPFBackend func(pinRoot string) EBPF

func pinRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/sys/fs/bpf", "airlock-test-")
	if err != nil {
		testenv.SkipOrFail(t, "bpffs not writable: "+err.Error())
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newEnv(t *testing.T, mode Mode) *env {
	t.Helper()
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	e := &env{mode: mode, tp: tp, root: pinRoot(t)}
	e.dp = e.open(t)
	t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
	return e
}

func (e *env) config() Config {
	return Config{
		Mode:  e.mode,
		NetNS: e.tp.Host.Path(),
		EBPF:  EBPFBackend(e.root),
		NFT:   nftfilter.Config{LogGroup: nflogGr},
	}
}

func (e *env) open(t *testing.T) datapath.Datapath {
	t.Helper()
	dp, err := New(e.config())
	if err != nil {
		t.Fatalf("New(%s): %v", e.mode, err)
	}
	if dp.Backend() != datapath.Backend(e.mode) {
		t.Fatalf("backend %s, want %s", dp.Backend(), e.mode)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}

func (e *env) spec(id string, p datapath.Policy) datapath.Spec {
	return datapath.Spec{
		ID: id, HostIfindex: e.tp.HostIfindex, HostIfname: e.tp.HostIfname,
		Addrs:     []netip.Addr{dt.Sandbox4, dt.Sandbox6},
		Resolvers: []netip.Addr{dt.Gateway4, dt.Gateway6},
		Policy:    p,
	}
}

// attachInCgroup attaches sandbox id with policy p to e's datapath, with a cgroup of
// its own (sandboxCgroup), whose directory it returns.
func (e *env) attachInCgroup(t *testing.T, id string, p datapath.Policy) string {
	t.Helper()
	cg := sandboxCgroup(t)
	spec := e.spec(id, p)
	spec.Cgroup = cg
	if err := e.dp.Attach(spec); err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	return cg
}

func basePolicy() datapath.Policy {
	return datapath.Policy{
		Rules: []datapath.Rule{
			{Prefix: netip.MustParsePrefix("198.18.1.0/24"), Proto: datapath.ProtoTCP, Ports: datapath.PortRange{First: 80, Last: 8080}, Action: datapath.ActionAllow, ID: 7},
			{Prefix: netip.MustParsePrefix("198.18.4.0/24"), Action: datapath.ActionAllow, ID: 8},
		},
		Default: datapath.ActionDeny,
	}
}

func mustReach(t *testing.T, tp *dt.Topology, a netip.Addr, port int) {
	t.Helper()
	if err := tp.Reach(a, port, long); err != nil {
		t.Fatalf("%s:%d must be reachable: %v", a, port, err)
	}
}

func mustNotReach(t *testing.T, tp *dt.Topology, a netip.Addr, port int) {
	t.Helper()
	if err := tp.Reach(a, port, short); err == nil {
		t.Fatalf("%s:%d must be unreachable", a, port)
	}
}

func waitEvent(t *testing.T, dp datapath.Datapath, match func(datapath.Event) bool) datapath.Event {
	t.Helper()
	timeout := time.After(long)
	for {
		select {
		case ev, ok := <-dp.Events():
			if !ok {
				t.Fatal("events channel closed")
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("no matching event")
		}
	}
}

func TestTraffic(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			const id = "sbx-traffic"
			if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
				t.Fatalf("Attach: %v", err)
			}
			tp := e.tp
			t.Run("static_cidr_reachable", func(t *testing.T) { mustReach(t, tp, dt.Static4, 80) })
			t.Run("static_port_rule", func(t *testing.T) { mustNotReach(t, tp, dt.Static4, 22) })
			t.Run("unknown_dropped_with_event", func(t *testing.T) {
				mustNotReach(t, tp, dt.Unknown4, 80)
				ev := waitEvent(t, e.dp, func(ev datapath.Event) bool {
					return ev.Kind == datapath.KindDrop && ev.Dst == netip.AddrPortFrom(dt.Unknown4, 80)
				})
				if ev.Sandbox != id || ev.Reason != datapath.ReasonDefaultDeny || ev.Src.Addr() != dt.Sandbox4 {
					t.Fatalf("drop event %v", ev)
				}
			})
			t.Run("dns_only_to_resolver", func(t *testing.T) {
				if err := tp.Sandbox.Exchange(netip.AddrPortFrom(dt.Gateway4, 53).String(), long); err != nil {
					t.Fatalf("udp dns to resolver: %v", err)
				}
				mustReach(t, tp, dt.Gateway4, 53)
				mustReach(t, tp, dt.Foreign4, 80) // the address is allowed...
				if err := tp.Sandbox.Exchange(netip.AddrPortFrom(dt.Foreign4, 53).String(), short); err == nil {
					t.Fatal("udp dns to another resolver passed")
				}
				mustNotReach(t, tp, dt.Foreign4, 53) // ...but not its DNS
			})
			t.Run("dot_dropped", func(t *testing.T) { mustNotReach(t, tp, dt.Foreign4, 853) })
			t.Run("ipv6_blocked", func(t *testing.T) { mustNotReach(t, tp, dt.Internet6, 80) })
			t.Run("replies_to_inbound_pass", func(t *testing.T) {
				c, err := tp.Host.Dial("tcp", netip.AddrPortFrom(dt.Sandbox4, dt.InboundTCP).String(), long)
				if err != nil {
					t.Fatalf("gateway to sandbox: %v", err)
				}
				defer c.Close()
				if err := dt.RoundTrip(c, long); err != nil {
					t.Fatalf("sandbox reply: %v", err)
				}
			})
			t.Run("learned_until_ttl_established_survives", func(t *testing.T) {
				const ttl = 2 * time.Second
				mustNotReach(t, tp, dt.Learned4, 80)
				if err := e.dp.Learn(id, dt.Learned4, nil, ttl); err != nil {
					t.Fatal(err)
				}
				learnedAt := time.Now()
				c, err := tp.Sandbox.Dial("tcp", netip.AddrPortFrom(dt.Learned4, 80).String(), long)
				if err != nil {
					t.Fatalf("learned address: %v", err)
				}
				defer c.Close()
				if err := dt.RoundTrip(c, long); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Until(learnedAt.Add(ttl + 500*time.Millisecond)))
				mustNotReach(t, tp, dt.Learned4, 80)
				if err := dt.RoundTrip(c, long); err != nil {
					t.Fatalf("established flow after expiry: %v", err)
				}
			})
			t.Run("update_applies_and_cuts", func(t *testing.T) {
				c, err := tp.Sandbox.Dial("tcp", netip.AddrPortFrom(dt.Static4, 8080).String(), long)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				p := basePolicy()
				p.Rules = p.Rules[1:]
				p.IPv6 = datapath.IPv6Filter
				p.Rules = append(p.Rules, datapath.Rule{Prefix: netip.MustParsePrefix("2001:db8:1::/48"), Action: datapath.ActionAllow})
				if err := e.dp.Update(id, p); err != nil {
					t.Fatal(err)
				}
				if err := dt.RoundTrip(c, short); err == nil {
					t.Fatal("established flow to a newly denied destination still passes")
				}
				mustNotReach(t, tp, dt.Static4, 80)
				mustReach(t, tp, dt.Internet6, 80)
				if err := e.dp.Update(id, basePolicy()); err != nil {
					t.Fatal(err)
				}
				mustNotReach(t, tp, dt.Internet6, 80)
			})
			t.Run("update_many_applies_and_cuts", func(t *testing.T) {
				bu, ok := e.dp.(datapath.BatchUpdater)
				if !ok {
					t.Fatalf("the %s datapath does not update in batches", e.dp.Backend())
				}
				c, err := tp.Sandbox.Dial("tcp", netip.AddrPortFrom(dt.Static4, 8080).String(), long)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				p := basePolicy()
				p.Rules = p.Rules[1:]
				errs := bu.UpdateMany([]datapath.PolicyUpdate{{ID: "nosuch", Policy: p}, {ID: id, Policy: p}})
				if len(errs) != 2 || !errors.Is(errs[0], datapath.ErrUnknownSandbox) || errs[1] != nil {
					t.Fatalf("UpdateMany errors %v", errs)
				}
				if err := dt.RoundTrip(c, short); err == nil {
					t.Fatal("established flow to a newly denied destination still passes after the batch")
				}
				mustNotReach(t, tp, dt.Static4, 80)
				if errs := bu.UpdateMany([]datapath.PolicyUpdate{{ID: id, Policy: basePolicy()}}); errs[0] != nil {
					t.Fatal(errs[0])
				}
				mustReach(t, tp, dt.Static4, 8080)
			})
			t.Run("detach_leaves_nothing", func(t *testing.T) {
				if err := e.dp.Detach(id); err != nil {
					t.Fatal(err)
				}
				e.assertClean(t, id)
				mustReach(t, tp, dt.Unknown4, 80) // no hook left
			})
		})
	}
}

// assertClean checks that no hook, map entry, chain, set or counter of sandbox id is
// left in the kernel.
func (e *env) assertClean(t *testing.T, id string) {
	t.Helper()
	e.assertCleanNoIf(t, id)
	if e.mode == ModeEBPF {
		if n := e.tcxPrograms(t); n != 0 {
			t.Errorf("%d eBPF programs still on %s", n, e.tp.HostIfname)
		}
	}
}

// assertCleanNoIf is assertClean without looking at the interface.
func (e *env) assertCleanNoIf(t *testing.T, id string) {
	t.Helper()
	if e.mode == ModeEBPF {
		ents, _ := os.ReadDir(filepath.Join(e.root, "links"))
		if len(ents) != 0 {
			t.Errorf("pinned links left: %v", ents)
		}
		for _, name := range []string{"cfg_by_ifindex", "meta_by_idx", "flows", "drop_seen"} {
			m, err := ebpf.LoadPinnedMap(filepath.Join(e.root, "maps", name), nil)
			if err != nil {
				t.Fatalf("open %s: %v", name, err)
			}
			var k, v []byte
			n := 0
			it := m.Iterate()
			for it.Next(&k, &v) {
				n++
			}
			m.Close()
			if n != 0 {
				t.Errorf("map %s has %d entries left", name, n)
			}
		}
		for _, name := range []string{"rules4_of", "rules6_of", "learned_of"} {
			m, err := ebpf.LoadPinnedMap(filepath.Join(e.root, "maps", name), nil)
			if err != nil {
				t.Fatalf("open %s: %v", name, err)
			}
			// A free index keeps its inner maps installed (a warm slot), empty.
			for i := uint32(0); i < 8; i++ {
				var inner uint32
				if err := m.Lookup(i, &inner); err != nil {
					continue
				}
				im, err := ebpf.NewMapFromID(ebpf.MapID(inner))
				if err != nil {
					continue // already freed
				}
				var k, v []byte
				n := 0
				for it := im.Iterate(); it.Next(&k, &v); {
					n++
				}
				im.Close()
				if n != 0 {
					t.Errorf("map %s slot %d holds inner map %d with %d entries", name, i, inner, n)
				}
			}
			m.Close()
		}
		return
	}
	f, err := os.Open(e.tp.Host.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	chains, _ := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	pre, _ := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev) // the pre-chains
	chains = append(chains, pre...)
	for _, ch := range chains {
		if strings.Contains(ch.Name, id) || ch.Device == e.tp.HostIfname {
			t.Errorf("chain left: %s", ch.Name)
		}
	}
	tbl := &nftables.Table{Name: nftfilter.TableName, Family: nftables.TableFamilyINet}
	sets, _ := c.GetSets(tbl)
	for _, s := range sets {
		if strings.Contains(s.Name, id) {
			t.Errorf("set left: %s", s.Name)
		}
	}
	objs, _ := c.GetObjects(tbl)
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && strings.Contains(co.Name, id) {
			t.Errorf("counter left: %s", co.Name)
		}
	}
}

// tcxPrograms counts the eBPF programs on the host veth, both directions: TCX links
// and Airlock's clsact filters.
func (e *env) tcxPrograms(t *testing.T) int {
	t.Helper()
	n := 0
	err := e.tp.Host.Do(func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			r, err := queryTCX(e.tp.HostIfindex, at)
			if err != nil {
				return err
			}
			n += r
		}
		l, err := netlink.LinkByIndex(e.tp.HostIfindex)
		if err != nil {
			return err
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(l, parent)
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "airlock_") {
					n++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("query tcx: %v", err)
	}
	return n
}

// childEnv makes the test binary act as a loader process that attaches, reports
// "ready" and waits to be killed.
const childEnv = "AIRLOCK_DATAPATH_CHILD"

func childMain() {
	a := strings.Split(os.Getenv(childEnv), ",") // mode,netns,root,ifindex,ifname,id
	ifindex, _ := strconv.Atoi(a[3])
	cfg := Config{Mode: Mode(a[0]), NetNS: a[1], EBPF: EBPFBackend(a[2])}
	dp, err := New(cfg)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	spec := datapath.Spec{
		ID: a[5], HostIfindex: ifindex, HostIfname: a[4],
		Addrs: []netip.Addr{dt.Sandbox4, dt.Sandbox6}, Resolvers: []netip.Addr{dt.Gateway4, dt.Gateway6},
		Policy: basePolicy(),
	}
	if err := dp.Attach(spec); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if err := dp.Learn(spec.ID, dt.Learned4, nil, time.Minute); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

func TestFailClosedAndAdopt(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			testenv.NeedBPF(t)
			tp := dt.NewTopology(t)
			e := &env{mode: mode, tp: tp, root: pinRoot(t)}
			t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
			const id = "sbx-failclosed"
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{string(mode), tp.Host.Path(), e.root, strconv.Itoa(tp.HostIfindex), tp.HostIfname, id}, ","))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			if strings.TrimSpace(line) != "ready" {
				cmd.Process.Kill()
				t.Fatalf("child: %q", line)
			}
			if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup runs
				t.Fatal(err)
			}
			cmd.Wait()

			// The loader is gone: pinned state keeps enforcing.
			mustNotReach(t, tp, dt.Unknown4, 80)
			mustReach(t, tp, dt.Learned4, 80)
			mustReach(t, tp, dt.Static4, 80)

			// Restart: adopt, attach again in place, no duplicate hook, no gap.
			e.dp = e.open(t)
			if got := e.dp.Attached(); len(got) != 1 || got[0] != id {
				t.Fatalf("adopted %v", got)
			}
			if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
				t.Fatalf("re-attach: %v", err)
			}
			if mode == ModeEBPF {
				if n := e.tcxPrograms(t); n != 2 {
					t.Fatalf("%d eBPF programs after adoption, want 2 (no second hook)", n)
				}
			}
			mustNotReach(t, tp, dt.Unknown4, 80)
			mustReach(t, tp, dt.Learned4, 80) // learned entries survive adoption
			if err := e.dp.Detach(id); err != nil {
				t.Fatal(err)
			}
			e.assertClean(t, id)
		})
	}
}

func TestAttachDetachCycles(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			for i := range 50 {
				id := "sbx-cycle-" + strconv.Itoa(i)
				if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
					t.Fatalf("cycle %d attach: %v", i, err)
				}
				if err := e.dp.Learn(id, dt.Learned4, nil, time.Minute); err != nil {
					t.Fatalf("cycle %d learn: %v", i, err)
				}
				if i == 0 {
					mustReach(t, e.tp, dt.Learned4, 80)
					mustNotReach(t, e.tp, dt.Unknown4, 80)
				}
				if err := e.dp.Detach(id); err != nil {
					t.Fatalf("cycle %d detach: %v", i, err)
				}
				e.assertClean(t, id)
			}
			if got := e.dp.Attached(); len(got) != 0 {
				t.Fatalf("attached after cycles: %v", got)
			}
		})
	}
}

func queryTCX(ifindex int, at ebpf.AttachType) (int, error) {
	r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		return 0, err
	}
	return len(r.Programs), nil
}

func TestLearnKeepsLaterExpiry(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			const id = "sbx-relearn"
			if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Learned4, nil, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Learned4, nil, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Unknown4, nil, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Unknown4, nil, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			mustReach(t, e.tp, dt.Learned4, 80) // extended
			mustReach(t, e.tp, dt.Unknown4, 80) // a shorter ttl does not shorten
			st, err := e.dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if s := st.Sandboxes[id]; s.Learned != 2 || s.FlowsNew < 2 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestL7Redirect(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			testenv.NeedBPF(t)
			tp := dt.NewTopology(t)
			e := &env{mode: mode, tp: tp, root: pinRoot(t)}
			t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
			const proxyPort = 15001
			l, err := tp.Host.Listen("tcp", ":"+strconv.Itoa(proxyPort))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					dst, err := nftfilter.OriginalDst(c.(*net.TCPConn))
					fmt.Fprintf(c, "%v %v\n", dst, err)
					c.Close()
				}
			}()
			cfg := e.config()
			cfg.L7ProxyPort = proxyPort
			dp, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
			p := basePolicy()
			p.L7 = true
			const id = "sbx-l7"
			if err := dp.Attach(e.spec(id, p)); err != nil {
				t.Fatal(err)
			}
			c, err := tp.Sandbox.Dial("tcp", netip.AddrPortFrom(dt.Unknown4, 443).String(), long)
			if err != nil {
				t.Fatalf("dial through redirect: %v", err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(long))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if want := netip.AddrPortFrom(dt.Unknown4, 443).String() + " <nil>\n"; line != want {
				t.Fatalf("proxy saw %q, want %q", line, want)
			}
			mustNotReach(t, tp, dt.Unknown4, 22) // only 80/443 go to the proxy
			mustReach(t, tp, dt.Static4, 80)     // a static rule decides before L7
			if err := dp.Detach(id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDetachAfterVethRemoved covers the usual deletion order: the runtime removes the
// container (and its veth) before egressd hears of it.
func TestDetachAfterVethRemoved(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			const id = "sbx-gone"
			if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Learned4, nil, time.Minute); err != nil {
				t.Fatal(err)
			}
			dt.IP(t, "-n", e.tp.Host.Name, "link", "del", e.tp.HostIfname)
			if err := e.dp.Detach(id); err != nil {
				t.Fatalf("detach after the veth is gone: %v", err)
			}
			e.assertCleanNoIf(t, id)
		})
	}
}

// TestLearnedGrants: an address learned for some ports (a name rule with ports) is
// reachable on those ports only; each grant expires on its own; an every-port grant
// adds to them; Update keeps established flows a grant allows; Forget removes every
// grant; an address holds at most MaxLearnedGrants live grants.
func TestLearnedGrants(t *testing.T) {
	tcp := func(lo, hi uint16) datapath.ProtoPorts {
		return datapath.ProtoPorts{Proto: datapath.ProtoTCP, Ports: datapath.PortRange{First: lo, Last: hi}}
	}
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			const id = "sbx-grants"
			if err := e.dp.Attach(e.spec(id, basePolicy())); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Learned4, []datapath.ProtoPorts{tcp(443, 443), tcp(8000, 8100)}, time.Minute); err != nil {
				t.Fatal(err)
			}
			mustReach(t, e.tp, dt.Learned4, 443)
			mustReach(t, e.tp, dt.Learned4, 8080)
			mustNotReach(t, e.tp, dt.Learned4, 80)
			mustNotReach(t, e.tp, dt.Learned4, 22)

			// Each grant has its own expiry; a shorter ttl never shortens a live one.
			if err := e.dp.Learn(id, dt.Learned4, []datapath.ProtoPorts{tcp(443, 443)}, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Learned4, []datapath.ProtoPorts{tcp(80, 80)}, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			mustReach(t, e.tp, dt.Learned4, 80)
			time.Sleep(time.Second)
			mustNotReach(t, e.tp, dt.Learned4, 80)
			mustReach(t, e.tp, dt.Learned4, 443)

			// Update keeps an established flow that a grant allows.
			c, err := e.tp.Sandbox.Dial("tcp", netip.AddrPortFrom(dt.Learned4, 8080).String(), long)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := e.dp.Update(id, basePolicy()); err != nil {
				t.Fatal(err)
			}
			if err := dt.RoundTrip(c, long); err != nil {
				t.Fatalf("a granted flow after Update: %v", err)
			}

			// An every-port grant adds to the others.
			if err := e.dp.Learn(id, dt.Learned4, nil, time.Minute); err != nil {
				t.Fatal(err)
			}
			mustReach(t, e.tp, dt.Learned4, 22)
			if err := e.dp.Forget(id, dt.Learned4); err != nil {
				t.Fatal(err)
			}
			mustNotReach(t, e.tp, dt.Learned4, 22)
			mustNotReach(t, e.tp, dt.Learned4, 443)
			if err := dt.RoundTrip(c, short); err == nil {
				t.Fatal("a granted flow survived Forget")
			}

			// At most MaxLearnedGrants live grants per address, none partially added.
			var many []datapath.ProtoPorts
			for p := range uint16(datapath.MaxLearnedGrants) {
				many = append(many, tcp(1000+p, 1000+p))
			}
			if err := e.dp.Learn(id, dt.Unknown4, many, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.Learn(id, dt.Unknown4, []datapath.ProtoPorts{tcp(443, 443)}, time.Minute); !errors.Is(err, datapath.ErrFull) {
				t.Fatalf("grant %d: %v, want ErrFull", datapath.MaxLearnedGrants+1, err)
			}
			mustNotReach(t, e.tp, dt.Unknown4, 443)
			if err := e.dp.Learn(id, dt.Unknown4, append(many, tcp(443, 443)), time.Minute); !errors.Is(err, datapath.ErrInvalidSpec) {
				t.Fatalf("%d grants in one call: %v, want ErrInvalidSpec", datapath.MaxLearnedGrants+1, err)
			}
			if err := e.dp.Learn(id, dt.Unknown4, []datapath.ProtoPorts{{Proto: datapath.ProtoICMP}}, time.Minute); !errors.Is(err, datapath.ErrInvalidSpec) {
				t.Fatalf("an ICMP grant: %v, want ErrInvalidSpec", err)
			}
		})
	}
}
