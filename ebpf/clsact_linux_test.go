package ebpf

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestClsactMode runs real traffic through the clsact fallback, adopts it from a second
// Datapath and detaches it, leaving no qdisc.
func TestClsactMode(t *testing.T) {
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	cfg := Config{PinRoot: testPinRoot(t), NetNS: tp.Host.Path(), Attach: AttachTC}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := datapath.Spec{
		ID: "clsact", HostIfindex: tp.HostIfindex, HostIfname: tp.HostIfname,
		Addrs: []netip.Addr{dt.Sandbox4}, Resolvers: []netip.Addr{dt.Gateway4},
		Policy: datapath.Policy{Rules: []datapath.Rule{{Prefix: netip.PrefixFrom(dt.Static4, 32), Action: datapath.ActionAllow}}},
	}
	if err := d.Attach(spec); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		if err := tp.Reach(dt.Static4, 80, 5*time.Second); err != nil {
			t.Fatalf("allowed: %v", err)
		}
		if err := tp.Reach(dt.Unknown4, 80, 700*time.Millisecond); err == nil {
			t.Fatal("unknown reachable")
		}
	}
	check()
	d.Close()
	check() // fail closed without a loader

	d2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got := d2.Attached(); len(got) != 1 || got[0] != "clsact" {
		t.Fatalf("adopted %v", got)
	}
	check()
	h, err := d2.ns.handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(tp.HostIfindex)
	if err != nil {
		t.Fatal(err)
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(l, parent)
		if err != nil || len(fs) != 1 {
			t.Fatalf("filters on %#x after adoption: %d (%v), want 1", parent, len(fs), err)
		}
	}
	if err := d2.Detach("clsact"); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("ip", "-n", tp.Host.Name, "qdisc", "show", "dev", tp.HostIfname).CombinedOutput()
	if strings.Contains(string(out), "clsact") {
		t.Fatalf("clsact left after detach:\n%s", out)
	}
	if err := tp.Reach(dt.Unknown4, 80, 5*time.Second); err != nil {
		t.Fatalf("after detach: %v", err)
	}
}

// TestTCXMode: with Attach: tcx the programs run on pinned TCX links, which a second
// Datapath adopts; detach removes the links and their directory.
func TestTCXMode(t *testing.T) {
	testenv.NeedBPF(t)
	tp := dt.NewTopology(t)
	cfg := Config{PinRoot: testPinRoot(t), NetNS: tp.Host.Path(), Attach: AttachTCX}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := datapath.Spec{
		ID: "tcx", HostIfindex: tp.HostIfindex, HostIfname: tp.HostIfname,
		Addrs: []netip.Addr{dt.Sandbox4}, Resolvers: []netip.Addr{dt.Gateway4},
		Policy: datapath.Policy{Rules: []datapath.Rule{{Prefix: netip.PrefixFrom(dt.Static4, 32), Action: datapath.ActionAllow}}},
	}
	if err := d.Attach(spec); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.PinRoot, "links", "0")
	for _, name := range []string{"ingress", "egress"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("pinned TCX link %s: %v", name, err)
		}
	}
	if err := tp.Reach(dt.Unknown4, 80, 700*time.Millisecond); err == nil {
		t.Fatal("unknown reachable")
	}
	d.Close()
	d2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got := d2.Attached(); len(got) != 1 || got[0] != "tcx" {
		t.Fatalf("adopted %v", got)
	}
	if err := tp.Reach(dt.Static4, 80, 5*time.Second); err != nil {
		t.Fatalf("allowed after adoption: %v", err)
	}
	if err := d2.Detach("tcx"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("link directory left after detach: %v", err)
	}
	if err := tp.Reach(dt.Unknown4, 80, 5*time.Second); err != nil {
		t.Fatalf("after detach: %v", err)
	}
}
