package ebpf

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bpf "github.com/cilium/ebpf"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// skbCtx is the head of struct __sk_buff up to ifindex (BPF_PROG_TEST_RUN accepts a
// prefix of the context).
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto,
	Priority, IngressIfindex, Ifindex uint32
}

const (
	tcActOK   = 0
	tcActShot = 2
)

// testPinRoot returns a fresh bpffs directory removed at cleanup.
func testPinRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/sys/fs/bpf", "airlock-test-")
	if err != nil {
		testenv.SkipOrFail(t, "bpffs not writable: "+err.Error())
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// pkt builds an Ethernet frame: IPv4 or IPv6 (by src), then a TCP/UDP/ICMP header.
type pkt struct {
	src, dst   netip.Addr
	proto      uint8
	sport      uint16
	dport      uint16
	tcpFlags   uint8
	icmpType   uint8
	fragOffset uint16 // IPv4 fragment offset in 8-byte units
}

func (p pkt) bytes() []byte {
	var l4 []byte
	switch p.proto {
	case 6:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], p.sport)
		binary.BigEndian.PutUint16(l4[2:], p.dport)
		l4[12] = 5 << 4
		l4[13] = p.tcpFlags
	case 17:
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[0:], p.sport)
		binary.BigEndian.PutUint16(l4[2:], p.dport)
		binary.BigEndian.PutUint16(l4[4:], 8)
	default:
		l4 = make([]byte, 8)
		l4[0] = p.icmpType
	}
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{2, 0, 0, 0, 0, 1})
	copy(eth[6:12], []byte{2, 0, 0, 0, 0, 2})
	if p.src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(ip[6:], p.fragOffset)
		ip[8] = 64
		ip[9] = p.proto
		s, d := p.src.As4(), p.dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		return append(append(eth, ip...), l4...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip[6] = p.proto
	ip[7] = 64
	s, d := p.src.As16(), p.dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(append(eth, ip...), l4...)
}

// verdictEnv is a loaded datapath with one sandbox attached to a veth in a private
// namespace, for running the programs on crafted packets.
type verdictEnv struct {
	d    *Datapath
	ns   datapathtest.Netns
	idx  int
	spec datapath.Spec
}

func newVerdictEnv(t *testing.T, p datapath.Policy) *verdictEnv {
	t.Helper()
	testenv.NeedBPF(t)
	ns := datapathtest.NewNetns(t, "alv-")
	datapathtest.IP(t, "-n", ns.Name, "link", "add", "h0", "type", "veth", "peer", "name", "s0")
	datapathtest.IP(t, "-n", ns.Name, "link", "set", "h0", "up")
	var idx int
	ns.Do(func() error {
		l, err := netIfindex("h0")
		idx = l
		return err
	})
	d, err := New(Config{PinRoot: testPinRoot(t), NetNS: ns.Path()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	spec := datapath.Spec{
		ID: "verdict", HostIfindex: idx, HostIfname: "h0",
		Addrs:     []netip.Addr{sbx4, sbx6},
		Resolvers: []netip.Addr{res4},
		Policy:    p,
	}
	if err := d.Attach(spec); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	return &verdictEnv{d: d, ns: ns, idx: idx, spec: spec}
}

// run runs prog on the packet as if it arrived on the sandbox's veth and returns the
// TC verdict and the mark the program left.
func (e *verdictEnv) run(t *testing.T, prog *bpf.Program, p pkt) (uint32, uint32) {
	t.Helper()
	var rc uint32
	var out struct {
		skbCtx
		Rest [192 - 44]byte // the kernel writes the whole __sk_buff back
	}
	err := e.ns.Do(func() error {
		var err error
		rc, err = prog.Run(&bpf.RunOptions{
			Data:       p.bytes(),
			Context:    skbCtx{Ifindex: uint32(e.idx)},
			ContextOut: &out,
		})
		return err
	})
	if err != nil {
		t.Fatalf("prog.Run: %v", err)
	}
	return rc, out.Mark
}

var (
	sbx4 = netip.MustParseAddr("10.77.0.2")
	sbx6 = netip.MustParseAddr("fd77::2")
	res4 = netip.MustParseAddr("10.77.0.1")
)

func TestLoadAndPinLayout(t *testing.T) {
	e := newVerdictEnv(t, datapath.Policy{})
	root := e.d.cfg.PinRoot
	for _, p := range []string{"maps/cfg_by_ifindex", "maps/flows", "maps/events", "maps/learned_of", "progs/from_sbx"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("pinned %s missing: %v", p, err)
		}
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

var verdictPolicy = datapath.Policy{
	Rules: []datapath.Rule{
		{Prefix: pfx("198.18.1.0/24"), Proto: datapath.ProtoTCP, Ports: datapath.PortRange{First: 443, Last: 443}, Action: datapath.ActionAllow, ID: 1},
		{Prefix: pfx("198.18.1.128/25"), Action: datapath.ActionDeny, ID: 2},
		{Prefix: pfx("198.18.1.0/24"), Action: datapath.ActionAllow, ID: 3},
		{Prefix: pfx("2001:db8:1::/48"), Proto: datapath.ProtoTCP, Ports: datapath.PortRange{First: 80, Last: 90}, Action: datapath.ActionAllow, ID: 4},
	},
	Default: datapath.ActionDeny,
	IPv6:    datapath.IPv6Filter,
}

func tcp(src, dst string, sport, dport uint16) pkt {
	return pkt{src: ip(src), dst: ip(dst), proto: 6, sport: sport, dport: dport, tcpFlags: 0x02}
}

func udp(src, dst string, sport, dport uint16) pkt {
	return pkt{src: ip(src), dst: ip(dst), proto: 17, sport: sport, dport: dport}
}

func TestVerdicts(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	if err := e.d.Learn("verdict", ip("198.18.2.1"), nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	ns := ip("fe80::1")
	frag := udp("10.77.0.2", "198.18.3.1", 0, 0)
	frag.fragOffset = 100
	fragOK := frag
	fragOK.dst = ip("198.18.1.5")
	cases := []struct {
		name string
		p    pkt
		want uint32
	}{
		{"rule3_allows_prefix", tcp("10.77.0.2", "198.18.1.5", 40000, 80), tcActOK},
		{"rule1_first_match_beats_deny", tcp("10.77.0.2", "198.18.1.200", 40000, 443), tcActOK},
		{"rule2_denies_longer_prefix", tcp("10.77.0.2", "198.18.1.200", 40000, 80), tcActShot},
		{"unknown_default_deny", tcp("10.77.0.2", "198.18.3.1", 40000, 80), tcActShot},
		{"learned_allows", tcp("10.77.0.2", "198.18.2.1", 40000, 22), tcActOK},
		{"dns_to_resolver", udp("10.77.0.2", "10.77.0.1", 40000, 53), tcActOK},
		{"dns_tcp_to_resolver", tcp("10.77.0.2", "10.77.0.1", 40000, 53), tcActOK},
		{"dns_to_other", udp("10.77.0.2", "198.18.4.1", 40000, 53), tcActShot},
		{"dns_to_allowed_prefix", tcp("10.77.0.2", "198.18.1.5", 40000, 53), tcActShot},
		{"dot", tcp("10.77.0.2", "198.18.1.5", 40000, 853), tcActShot},
		{"doq", udp("10.77.0.2", "198.18.1.5", 40000, 853), tcActShot},
		{"spoofed_source", tcp("10.77.0.9", "198.18.1.5", 40000, 80), tcActShot},
		{"v6_rule_port", tcp("fd77::2", "2001:db8:1::1", 40000, 85), tcActOK},
		{"v6_rule_other_port", tcp("fd77::2", "2001:db8:1::1", 40000, 443), tcActShot},
		{"v6_neighbour_solicit", pkt{src: ns, dst: ip("ff02::1:ff00:1"), proto: 58, icmpType: 135}, tcActOK},
		{"v6_echo_request_denied", pkt{src: ip("fd77::2"), dst: ip("2001:db8:9::1"), proto: 58, icmpType: 128}, tcActShot},
		{"fragment_denied_dst", frag, tcActShot},
		{"fragment_allowed_dst", fragOK, tcActOK},
		{"icmp_echo_reply", pkt{src: ip("10.77.0.2"), dst: ip("10.77.0.1"), proto: 1, icmpType: 0}, tcActOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := e.run(t, e.d.objs.AirlockFromSbx, c.p); got != c.want {
				t.Fatalf("verdict %d, want %d", got, c.want)
			}
		})
	}
	t.Run("arp_passes", func(t *testing.T) {
		b := make([]byte, 42)
		binary.BigEndian.PutUint16(b[12:], 0x0806)
		var rc uint32
		e.ns.Do(func() error {
			var err error
			rc, err = e.d.objs.AirlockFromSbx.Run(&bpf.RunOptions{Data: b, Context: skbCtx{Ifindex: uint32(e.idx)}})
			return err
		})
		if rc != tcActOK {
			t.Fatalf("arp verdict %d", rc)
		}
	})
	t.Run("events", func(t *testing.T) {
		evs := waitEvents(t, e.d,
			func(ev datapath.Event) bool {
				return ev.Kind == datapath.KindDrop && ev.Dst == netip.MustParseAddrPort("198.18.3.1:80")
			},
			func(ev datapath.Event) bool {
				return ev.Kind == datapath.KindFlow && ev.Dst == netip.MustParseAddrPort("198.18.1.200:443")
			})
		if ev := evs[0]; ev.Sandbox != "verdict" || ev.Reason != datapath.ReasonDefaultDeny || ev.Proto != datapath.ProtoTCP || ev.Src != netip.MustParseAddrPort("10.77.0.2:40000") {
			t.Fatalf("drop event %v", ev)
		}
		if ev := evs[1]; ev.Reason != datapath.ReasonRuleAllow || ev.Rule != 1 {
			t.Fatalf("flow event %v", ev)
		}
	})
}

// waitEvents reads events until each predicate matched one, in any order.
func waitEvents(t *testing.T, d *Datapath, preds ...func(datapath.Event) bool) []datapath.Event {
	t.Helper()
	out := make([]datapath.Event, len(preds))
	found := 0
	timeout := time.After(5 * time.Second)
	for found < len(preds) {
		select {
		case ev := <-d.Events():
			for i, p := range preds {
				if out[i].Kind == 0 && p(ev) {
					out[i] = ev
					found++
					break
				}
			}
		case <-timeout:
			t.Fatalf("%d of %d events seen: %v", found, len(preds), out)
		}
	}
	return out
}

func TestFlowsOutliveLearnedEntries(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	if err := e.d.Learn("verdict", ip("198.18.2.3"), nil, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	first := tcp("10.77.0.2", "198.18.2.3", 41000, 80)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, first); got != tcActOK {
		t.Fatalf("learned first packet: %d", got)
	}
	time.Sleep(400 * time.Millisecond)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, first); got != tcActOK {
		t.Fatalf("established flow after expiry: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.2.3", 41001, 80)); got != tcActShot {
		t.Fatalf("new flow after expiry: %d", got)
	}
}

func TestInboundConnectionReplies(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	synack := tcp("10.77.0.2", "10.77.0.1", 9000, 5555)
	synack.tcpFlags = 0x12
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, synack); got != tcActShot {
		t.Fatalf("reply without inbound connection: %d", got)
	}
	syn := tcp("10.77.0.1", "10.77.0.2", 5555, 9000)
	if got, _ := e.run(t, e.d.objs.AirlockToSbx, syn); got != tcActOK {
		t.Fatalf("inbound syn: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, synack); got != tcActOK {
		t.Fatalf("reply to inbound connection: %d", got)
	}
}

func TestPolicyUpdate(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	flow := tcp("10.77.0.2", "198.18.1.5", 42000, 8080)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActOK {
		t.Fatalf("before update: %d", got)
	}
	p := verdictPolicy
	p.Rules = p.Rules[:2]
	p.L7 = true
	p.IPv6 = datapath.IPv6Block
	if err := e.d.Update("verdict", p); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActShot {
		t.Fatalf("established flow to a newly denied destination: %d", got)
	}
	got, mark := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.3.1", 42001, 443))
	if got != tcActOK || mark&datapath.DefaultL7MarkMask != datapath.DefaultL7Mark {
		t.Fatalf("l7: verdict %d mark %#x", got, mark)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.3.1", 42001, 22)); got != tcActShot {
		t.Fatalf("l7 other port: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("fd77::2", "2001:db8:1::1", 40000, 85)); got != tcActShot {
		t.Fatalf("ipv6 blocked: %d", got)
	}
	p.Report = true
	if err := e.d.Update("verdict", p); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.3.1", 42002, 22)); got != tcActOK {
		t.Fatalf("report mode: %d", got)
	}
	waitEvents(t, e.d, func(ev datapath.Event) bool {
		return ev.Kind == datapath.KindWouldDrop && ev.Dst == netip.MustParseAddrPort("198.18.3.1:22")
	})
	// A deny-always rule (the overlay, the guard) holds in report mode.
	p.Rules = append([]datapath.Rule{{Prefix: pfx("198.18.9.0/24"), Action: datapath.ActionDenyAlways, ID: 9}}, p.Rules...)
	if err := e.d.Update("verdict", p); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.9.1", 42003, 80)); got != tcActShot {
		t.Fatalf("deny-always rule in report mode: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.3.1", 42004, 22)); got != tcActOK {
		t.Fatalf("report mode beside a deny-always rule: %d", got)
	}
}

func TestForgetCutsFlows(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	e.d.Learn("verdict", ip("198.18.2.4"), nil, time.Hour)
	flow := tcp("10.77.0.2", "198.18.2.4", 43000, 80)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActOK {
		t.Fatalf("learned: %d", got)
	}
	if err := e.d.Forget("verdict", ip("198.18.2.4")); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActShot {
		t.Fatalf("after forget: %d", got)
	}
}

func TestInvalidSpecChangesNothing(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	bad := verdictPolicy
	bad.Rules = append([]datapath.Rule(nil), verdictPolicy.Rules...)
	for range 17 {
		bad.Rules = append(bad.Rules, datapath.Rule{Prefix: pfx("198.18.1.5/32"), Action: datapath.ActionDeny})
	}
	if err := e.d.Update("verdict", bad); !errors.Is(err, datapath.ErrInvalidSpec) {
		t.Fatalf("update with 21 rules over one address: %v", err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.1.5", 44000, 80)); got != tcActOK {
		t.Fatalf("old policy must stay: %d", got)
	}
	if err := e.d.Learn("nope", ip("198.18.2.1"), nil, time.Hour); !errors.Is(err, datapath.ErrUnknownSandbox) {
		t.Fatalf("learn for unknown sandbox: %v", err)
	}
}

func netIfindex(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, err
	}
	return ifc.Index, nil
}

// TestStaleLayout: pinned state whose layout marker names another build is refused
// while it still enforces a sandbox (removing it would leave the sandbox unfiltered),
// and replaced once nothing is attached.
func TestStaleLayout(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	cfg := Config{PinRoot: e.d.cfg.PinRoot, NetNS: e.d.cfg.NetNS}
	markers := func() []string {
		m, _ := filepath.Glob(filepath.Join(cfg.PinRoot, "maps", layoutPrefix+"*"))
		return m
	}
	cur := markers()
	if len(cur) != 1 {
		t.Fatalf("layout markers %v, want one", cur)
	}
	stale := filepath.Join(cfg.PinRoot, "maps", layoutPrefix+"0000000000000000")
	if err := os.Rename(cur[0], stale); err != nil {
		t.Fatal(err)
	}
	e.d.Close()
	if d, err := New(cfg); err == nil || !strings.Contains(err.Error(), "still enforces 1 sandbox") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("New over stale state with a sandbox attached: %v", err)
	}
	if got := markers(); len(got) != 1 || got[0] != stale {
		t.Fatalf("refused state was changed: markers %v", got)
	}
	// Detach with the matching build, then the stale state is replaced.
	if err := os.Rename(stale, cur[0]); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Detach("verdict"); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := os.Rename(cur[0], stale); err != nil {
		t.Fatal(err)
	}
	d, err = New(cfg)
	if err != nil {
		t.Fatalf("New over stale state with nothing attached: %v", err)
	}
	d.Close()
	if got := markers(); len(got) != 1 || got[0] != cur[0] {
		t.Fatalf("markers after the reset %v, want %v", got, cur)
	}
}

// TestUpdateMany: a batch update applies like Update (an established flow to a newly
// denied destination is cut, the new rules decide) and reports an unknown sandbox per
// element without failing the others.
func TestUpdateMany(t *testing.T) {
	e := newVerdictEnv(t, verdictPolicy)
	flow := tcp("10.77.0.2", "198.18.1.5", 42000, 8080)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActOK {
		t.Fatalf("before update: %d", got)
	}
	p := verdictPolicy
	p.Rules = p.Rules[:2]
	errs := e.d.UpdateMany([]datapath.PolicyUpdate{{ID: "nosuch", Policy: p}, {ID: "verdict", Policy: p}})
	if len(errs) != 2 || !errors.Is(errs[0], datapath.ErrUnknownSandbox) || errs[1] != nil {
		t.Fatalf("errors %v", errs)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActShot {
		t.Fatalf("established flow to a newly denied destination after the batch: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.1.5", 42010, 8080)); got != tcActShot {
		t.Fatalf("new flow to a removed rule's destination: %d", got)
	}
}
