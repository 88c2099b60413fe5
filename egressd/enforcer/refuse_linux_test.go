package enforcer

import (
	"errors"
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

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/cgroupv2"
	"github.com/airlockdev/airlock/internal/testenv"
)

// connectChildEnv makes the test binary a sandbox process: it joins a cgroup, enters
// the sandbox's network namespace, tries a connection n times and prints the last
// outcome ("ok", "errno <name>" or "timeout") and each attempt's time in ns:
// "<outcome>|<ns>,<ns>,...".
const connectChildEnv = "AIRLOCK_CONNECT_CHILD"

func connectChildMain() {
	a := childArgs(connectChildEnv) // cgroup,netns,network,addr[,n]
	n := 1
	if len(a) > 4 {
		n, _ = strconv.Atoi(a[4])
	}
	ns := dt.Netns{Name: filepath.Base(a[1])}
	var outcome string
	took := make([]string, 0, n)
	var cpu time.Duration
	err := ns.Do(func() error {
		cpu0 := benchreport.ProcessCPU()
		for range n {
			start := time.Now()
			outcome = tryOnce(a[2], a[3])
			took = append(took, strconv.FormatInt(int64(time.Since(start)), 10))
		}
		cpu = benchreport.ProcessCPU() - cpu0
		return nil
	})
	if err != nil {
		childFail(err)
	}
	fmt.Println(outcome + "|" + strings.Join(took, ",") + "|" + strconv.FormatInt(int64(cpu), 10))
}

// tryOnce connects (tcp) or sends a datagram and waits for the echo (udp).
func tryOnce(network, addr string) string {
	c, err := net.DialTimeout(network, addr, 3*time.Second)
	if err == nil && network == "udp" {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err = c.Write([]byte("ping")); err == nil {
			_, err = c.Read(make([]byte, 64))
		}
	}
	if c != nil {
		c.Close()
	}
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return "errno " + errnoName(errno)
	case os.IsTimeout(err):
		return "timeout"
	}
	return "error " + strings.ReplaceAll(err.Error(), " ", "_")
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EPERM:
		return "EPERM"
	case syscall.ECONNREFUSED:
		return "ECONNREFUSED"
	case syscall.EHOSTUNREACH:
		return "EHOSTUNREACH"
	case syscall.ENETUNREACH:
		return "ENETUNREACH"
	case syscall.EACCES:
		return "EACCES"
	}
	return fmt.Sprintf("errno%d", int(e))
}

// sandboxCgroup creates a cgroup v2 directory for the test's sandbox processes.
func sandboxCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := cgroupv2.Mount()
	if err != nil {
		testenv.SkipOrFail(t, "cgroup v2 not mounted: "+err.Error())
	}
	dir, err := os.MkdirTemp(mnt, "airlock-test-")
	if err != nil {
		testenv.SkipOrFail(t, "cgroup v2 not writable: "+err.Error())
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// attempt runs one connection attempt as a process of the sandbox in cgroup cg.
func attempt(t *testing.T, tp *dt.Topology, cg, network string, dst netip.AddrPort) string {
	t.Helper()
	outcome, _ := attempts(t, tp, cg, network, dst, 1)
	return outcome
}

// attempts runs n connection attempts as one process of the sandbox in cgroup cg and
// returns the last outcome and every attempt's duration.
func attempts(t *testing.T, tp *dt.Topology, cg, network string, dst netip.AddrPort, n int) (string, []time.Duration) {
	t.Helper()
	outcome, took, _ := attemptsCPU(t, tp, cg, network, dst, n)
	return outcome, took
}

// attemptsCPU is attempts that also returns the CPU time the attempting process used
// for all n (benchreport.ProcessCPU).
func attemptsCPU(t *testing.T, tp *dt.Topology, cg, network string, dst netip.AddrPort, n int) (string, []time.Duration, time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), connectChildEnv+"="+strings.Join([]string{cg, tp.Sandbox.Path(), network, dst.String(), strconv.Itoa(n)}, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	parts := strings.Split(strings.TrimSpace(string(out)), "|")
	if len(parts) != 3 {
		t.Fatalf("child output %q", out)
	}
	var took []time.Duration
	for _, f := range strings.Split(parts[1], ",") {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("child output %q", out)
		}
		took = append(took, time.Duration(ns))
	}
	cpu, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		t.Fatalf("child output %q", out)
	}
	return parts[0], took, time.Duration(cpu)
}

// TestImmediateRefusal: a denied connection fails at once, with EPERM from the socket
// layer (eBPF) or a reset / ICMP administratively prohibited (nftables), and is
// reported once; allowed destinations, DNS to the resolver and loopback still work.
func TestImmediateRefusal(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, mode)
			tp := e.tp
			const id = "sbx-refuse"
			cg := e.attachInCgroup(t, id, basePolicy())
			wantTCP, wantUDP := "errno ECONNREFUSED", "errno EHOSTUNREACH"
			if mode == ModeEBPF {
				wantTCP, wantUDP = "errno EPERM", "errno EPERM"
			}
			denied := netip.AddrPortFrom(dt.Unknown4, 80)
			if got := attempt(t, tp, cg, "tcp", denied); got != wantTCP {
				t.Fatalf("tcp to a denied address: %s, want %s", got, wantTCP)
			}
			ev := waitEvent(t, e.dp, func(ev datapath.Event) bool {
				return ev.Kind == datapath.KindDrop && ev.Dst == denied
			})
			if ev.Sandbox != id || ev.Reason != datapath.ReasonDefaultDeny || ev.Refused != (mode == ModeEBPF) {
				t.Fatalf("event %v", ev)
			}
			if got := attempt(t, tp, cg, "udp", netip.AddrPortFrom(dt.Unknown4, dt.UDPPort)); got != wantUDP {
				t.Fatalf("udp to a denied address: %s, want %s", got, wantUDP)
			}
			if got := attempt(t, tp, cg, "tcp", netip.AddrPortFrom(dt.Foreign4, 53)); got != wantTCP {
				t.Fatalf("dns to a foreign resolver: %s, want %s", got, wantTCP)
			}
			for _, ok := range []struct {
				network string
				dst     netip.AddrPort
			}{
				{"tcp", netip.AddrPortFrom(dt.Static4, 80)},
				{"udp", netip.AddrPortFrom(dt.Gateway4, 53)},
				{"tcp", netip.AddrPortFrom(dt.Sandbox4, dt.InboundTCP)},                      // own address
				{"tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dt.InboundTCP)}, // loopback
				{"tcp", netip.AddrPortFrom(netip.MustParseAddr("::ffff:198.18.1.1"), 80)},    // IPv4-mapped, allowed
			} {
				if got := attempt(t, tp, cg, ok.network, ok.dst); got != "ok" {
					t.Fatalf("%s %s: %s, want ok", ok.network, ok.dst, got)
				}
			}
			// An IPv4-mapped form of a denied address is denied like the address.
			if got := attempt(t, tp, cg, "tcp", netip.AddrPortFrom(netip.MustParseAddr("::ffff:198.18.3.1"), 80)); got != wantTCP {
				t.Fatalf("tcp to a denied IPv4-mapped address: %s, want %s", got, wantTCP)
			}
			if err := e.dp.Detach(id); err != nil {
				t.Fatal(err)
			}
			if mode == ModeEBPF {
				// Detached: the cgroup carries no program of ours any more.
				if got := attempt(t, tp, cg, "tcp", denied); got == wantTCP {
					t.Fatalf("after Detach the socket layer still refuses: %s", got)
				}
			}
		})
	}
}
