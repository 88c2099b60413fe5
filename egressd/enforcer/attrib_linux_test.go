package enforcer

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
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
