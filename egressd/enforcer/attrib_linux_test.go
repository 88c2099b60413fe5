package enforcer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/internal/testenv"
)

// cgroupPrograms counts the eBPF programs attached to the cgroup directory cg at the
// hooks process attribution uses (connect, sendmsg, sock_ops).
func cgroupPrograms(t *testing.T, cg string) int {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for _, at := range []bpf.AttachType{bpf.AttachCGroupInet4Connect, bpf.AttachCGroupInet6Connect,
		bpf.AttachCGroupUDP4Sendmsg, bpf.AttachCGroupUDP6Sendmsg, bpf.AttachCGroupSockOps} {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s: %v", at, err)
		}
		n += len(r.Programs)
	}
	return n
}

// TestNFTablesAttribution: on the nftables datapath the eBPF socket programs, loaded
// recording only, name the process behind each event (a denied TCP connect, a denied
// UDP datagram, an allowed TCP flow: the test binary's child, whose parent is this
// process) without deciding anything (the denials are nftables': a reset and an ICMP
// error, not EPERM); Detach and Close leave no program on the cgroup and nothing in
// bpffs.
func TestNFTablesAttribution(t *testing.T) {
	e := newEnv(t, ModeNFTables)
	tp := e.tp
	cg := sandboxCgroup(t)
	const id = "sbx-nftattr"
	spec := e.spec(id, basePolicy())
	spec.Cgroup = cg
	if err := e.dp.Attach(spec); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if n := cgroupPrograms(t, cg); n != 5 {
		t.Fatalf("%d programs on the sandbox's cgroup, want 5 (connect4/6, sendmsg4/6, sock_ops)", n)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	checkProc := func(what string, ev datapath.Event) {
		t.Helper()
		p := ev.Process
		if p == nil {
			t.Fatalf("%s: event without a process: %v", what, ev)
		}
		if p.PID == 0 || p.PID == uint32(os.Getpid()) || p.PPID != uint32(os.Getpid()) || p.PGID == 0 || p.Start == 0 {
			t.Errorf("%s: process %+v, want a child of %d", what, p, os.Getpid())
		}
		if name := filepath.Base(exe); !strings.HasPrefix(name, p.Exe) || p.Exe == "" {
			t.Errorf("%s: executable %q, want %q", what, p.Exe, name)
		}
		if !slices.Contains(p.Args, "-test.run=^$") {
			t.Errorf("%s: command line %q", what, p.Args)
		}
	}

	denied := netip.AddrPortFrom(dt.Unknown4, 80)
	if got := attempt(t, tp, cg, "tcp", denied); got != "errno ECONNREFUSED" {
		t.Fatalf("tcp to a denied address: %s, want the nftables reset (the socket programs decide nothing)", got)
	}
	checkProc("denied tcp", waitEvent(t, e.dp, func(ev datapath.Event) bool {
		return ev.Kind == datapath.KindDrop && ev.Dst == denied
	}))
	deniedUDP := netip.AddrPortFrom(dt.Unknown4, dt.UDPPort)
	if got := attempt(t, tp, cg, "udp", deniedUDP); got != "errno EHOSTUNREACH" {
		t.Fatalf("udp to a denied address: %s", got)
	}
	checkProc("denied udp", waitEvent(t, e.dp, func(ev datapath.Event) bool {
		return ev.Kind == datapath.KindDrop && ev.Dst == deniedUDP
	}))
	allowed := netip.AddrPortFrom(dt.Static4, 80)
	if got := attempt(t, tp, cg, "tcp", allowed); got != "ok" {
		t.Fatalf("tcp to an allowed address: %s", got)
	}
	checkProc("allowed tcp", waitEvent(t, e.dp, func(ev datapath.Event) bool {
		return ev.Kind == datapath.KindFlow && ev.Dst == allowed
	}))

	if err := e.dp.Detach(id); err != nil {
		t.Fatal(err)
	}
	if n := cgroupPrograms(t, cg); n != 0 {
		t.Fatalf("%d programs on the cgroup after Detach", n)
	}
	if err := e.dp.Attach(spec); err != nil {
		t.Fatal(err)
	}
	if n := cgroupPrograms(t, cg); n != 5 {
		t.Fatalf("%d programs on the cgroup after a second Attach, want 5", n)
	}
	if err := e.dp.Close(); err != nil {
		t.Fatal(err)
	}
	if n := cgroupPrograms(t, cg); n != 0 {
		t.Fatalf("%d programs on the cgroup after Close", n)
	}
	if ents, _ := os.ReadDir(e.root); len(ents) != 0 {
		t.Fatalf("pinned state under %s on the nftables datapath: %v", e.root, ents)
	}
}

// noAttribution is an eBPF backend whose recording-only programs do not load (as on a
// kernel without cgroup eBPF).
type noAttribution struct{ EBPF }

func (noAttribution) OpenAttribution(*slog.Logger) (datapath.Attributor, error) {
	return nil, fmt.Errorf("%w: cgroup programs refused (test)", datapath.ErrUnavailable)
}

// TestNFTablesWithoutAttribution: when the recording-only programs cannot load, the
// nftables datapath enforces as before, its events name no process, and the log says
// why once.
func TestNFTablesWithoutAttribution(t *testing.T) {
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
	e := &env{mode: ModeNFTables, tp: tp, root: pinRoot(t)}
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := e.config()
	cfg.EBPF = noAttribution{cfg.EBPF}
	cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	dp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	cg := sandboxCgroup(t)
	for _, id := range []string{"sbx-noattr-1", "sbx-noattr-2"} {
		spec := e.spec(id, basePolicy())
		spec.Cgroup = cg
		if err := dp.Attach(spec); err != nil {
			t.Fatal(err)
		}
		if id == "sbx-noattr-1" {
			denied := netip.AddrPortFrom(dt.Unknown4, 80)
			if got := attempt(t, tp, cg, "tcp", denied); got != "errno ECONNREFUSED" {
				t.Fatalf("tcp to a denied address: %s", got)
			}
			ev := waitEvent(t, dp, func(ev datapath.Event) bool { return ev.Kind == datapath.KindDrop && ev.Dst == denied })
			if ev.Process != nil {
				t.Fatalf("a process without attribution: %+v", ev.Process)
			}
		}
		if err := dp.Detach(id); err != nil {
			t.Fatal(err)
		}
	}
	if n := cgroupPrograms(t, cg); n != 0 {
		t.Fatalf("%d programs on the cgroup", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "process attribution off on the nftables datapath"); n != 1 {
		t.Fatalf("the reason is logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "cgroup programs refused (test)") {
		t.Fatalf("the log does not say why:\n%s", logs.String())
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// attachFails is an eBPF backend whose datapath refuses to attach the sandbox id (as
// when the kernel refuses one sandbox's programs), so that auto mode falls back to
// nftables for it.
type attachFails struct {
	EBPF
	id string
}

func (a attachFails) Open(netns string, log *slog.Logger) (datapath.Datapath, error) {
	dp, err := a.EBPF.Open(netns, log)
	return refuseAttach{dp, a.id}, err
}

func (a attachFails) OpenMarked(netns string, mark, mask uint32, log *slog.Logger) (datapath.Datapath, error) {
	dp, err := a.EBPF.(markChooser).OpenMarked(netns, mark, mask, log)
	return refuseAttach{dp, a.id}, err
}

func (a attachFails) RedirectMarkOr(mark, mask uint32) (uint32, uint32) {
	return a.EBPF.(markChooser).RedirectMarkOr(mark, mask)
}

func (a attachFails) OpenAttribution(log *slog.Logger) (datapath.Attributor, error) {
	return a.EBPF.(attributionOpener).OpenAttribution(log)
}

type refuseAttach struct {
	datapath.Datapath
	id string
}

func (r refuseAttach) Attach(spec datapath.Spec) error {
	if spec.ID == r.id {
		return fmt.Errorf("%w: attach refused (test)", datapath.ErrUnavailable)
	}
	return r.Datapath.Attach(spec)
}

// TestAutoFallbackAttribution: in auto mode a sandbox whose eBPF attach fails is
// enforced by nftables (a denied connect is reset, not EPERM) and its flows still name
// their process: the recording-only programs load for it, on its cgroup only, and go
// with its Detach and the datapath's Close.
func TestAutoFallbackAttribution(t *testing.T) {
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	t.Cleanup(func() { nftfilter.RemoveTable(tp.Host.Path(), "") })
	e := &env{mode: ModeAuto, tp: tp, root: pinRoot(t)}
	const id = "sbx-fallback"
	cfg := e.config()
	cfg.EBPF = attachFails{cfg.EBPF, id}
	dp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			dp.Close()
		}
	})
	cg := sandboxCgroup(t)
	spec := e.spec(id, basePolicy())
	spec.Cgroup = cg
	if err := dp.Attach(spec); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if n := cgroupPrograms(t, cg); n != 5 {
		t.Fatalf("%d programs on the fallen-back sandbox's cgroup, want the 5 recording ones", n)
	}
	denied := netip.AddrPortFrom(dt.Unknown4, 80)
	if got := attempt(t, tp, cg, "tcp", denied); got != "errno ECONNREFUSED" {
		t.Fatalf("tcp to a denied address: %s, want the nftables reset", got)
	}
	ev := waitEvent(t, dp, func(ev datapath.Event) bool { return ev.Kind == datapath.KindDrop && ev.Dst == denied })
	if p := ev.Process; p == nil || p.PPID != uint32(os.Getpid()) || p.PID == 0 {
		t.Fatalf("the fallen-back sandbox's denial names process %+v, want a child of %d", ev.Process, os.Getpid())
	}
	if err := dp.Detach(id); err != nil {
		t.Fatal(err)
	}
	if n := cgroupPrograms(t, cg); n != 0 {
		t.Fatalf("%d programs on the cgroup after Detach", n)
	}
	if err := dp.Attach(spec); err != nil {
		t.Fatal(err)
	}
	closed = true
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	if n := cgroupPrograms(t, cg); n != 0 {
		t.Fatalf("%d programs on the cgroup after Close", n)
	}
}

// EBPFBackendTaskReads is EBPFBackend with the socket programs reading the calling task
// field by field (ebpf.Config.TaskReads); set by backend_linux_test.go.
var EBPFBackendTaskReads func(pinRoot string) EBPF

// TestAttributionTaskReads: the socket programs describe the process that connects
// alike whether they read the task through its BTF pointer (the default) or field by
// field (the fallback for kernels without bpf_get_current_task_btf in socket
// programs), on both datapaths: the same executable, command line, name, parent, and
// process group and ids as /proc shows them.
func TestAttributionTaskReads(t *testing.T) {
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			var procs []*datapath.Process
			for _, reads := range []bool{false, true} {
				e := newEnv(t, mode)
				if reads {
					e.dp.Close()
					cfg := e.config()
					cfg.EBPF = EBPFBackendTaskReads(e.root)
					dp, err := New(cfg)
					if err != nil {
						t.Fatalf("New with TaskReads: %v", err)
					}
					t.Cleanup(func() { dp.Close() })
					e.dp = dp
				}
				cg := e.attachInCgroup(t, "sbx-taskreads", basePolicy())
				denied := netip.AddrPortFrom(dt.Unknown4, 80)
				attempt(t, e.tp, cg, "tcp", denied)
				ev := waitEvent(t, e.dp, func(ev datapath.Event) bool { return ev.Dst == denied })
				p := ev.Process
				if p == nil {
					t.Fatalf("TaskReads %v: the denial names no process", reads)
				}
				// The child is in this test's pid namespace: its ids there are its ids.
				if p.PID == 0 || p.PPID != uint32(os.Getpid()) || p.PGID == 0 || p.NSPID != p.PID || p.NSPGID != p.PGID || p.Start == 0 {
					t.Errorf("TaskReads %v: process %+v, want a child of %d with its ids", reads, p, os.Getpid())
				}
				procs = append(procs, p)
				e.dp.Detach("sbx-taskreads")
			}
			a, b := *procs[0], *procs[1]
			if a.Comm == "" || a.Exe == "" || len(a.Args) == 0 {
				t.Fatalf("through the BTF pointer: process %+v lacks its name, executable or command line", a)
			}
			if a.Comm != b.Comm || a.Exe != b.Exe || !slices.Equal(a.Args, b.Args) || a.ArgsCut != b.ArgsCut || a.PPID != b.PPID {
				t.Fatalf("the two reads differ:\nBTF pointer  %+v\nfield reads  %+v", a, b)
			}
		})
	}
}

// TestAttributionEntryEndsWithSocket: on the eBPF datapath, whose TC program names the
// process in the flow's events as the packets pass, a TCP flow's entry in proc_by_flow
// is removed when its socket closes (sock_ops' state callback), so the map holds the
// open connections only; the flow's event still names the process.
func TestAttributionEntryEndsWithSocket(t *testing.T) {
	e := newEnv(t, ModeEBPF)
	cg := e.attachInCgroup(t, "sbx-procend", basePolicy())
	dst := netip.AddrPortFrom(dt.Static4, 80)
	if got := attempt(t, e.tp, cg, "tcp", dst); got != "ok" {
		t.Fatalf("connect to %s: %s", dst, got)
	}
	ev := waitEvent(t, e.dp, func(ev datapath.Event) bool { return ev.Dst == dst })
	if ev.Process == nil || ev.Process.PID == 0 {
		t.Fatalf("the flow's event names no process: %+v", ev)
	}
	m, err := bpf.LoadPinnedMap(filepath.Join(e.root, "maps", "proc_by_flow"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// proc_key: proto, family, lport and rport (host order), pad, laddr, raddr (16
	// bytes each, IPv4-mapped).
	flow := func() int {
		n := 0
		var k, v []byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			raddr := netip.AddrFrom16([16]byte(k[24:40])).Unmap()
			if k[0] == 6 && binary.NativeEndian.Uint16(k[2:]) == ev.Src.Port() &&
				binary.NativeEndian.Uint16(k[4:]) == dst.Port() && raddr == dst.Addr() {
				n++
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(long)
	for flow() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("proc_by_flow still holds %s -> %s after its socket closed", ev.Src, dst)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
