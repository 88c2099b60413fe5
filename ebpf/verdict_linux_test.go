package egressbpf

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
func (e *verdictEnv) run(t *testing.T, prog *ebpf.Program, p pkt) (uint32, uint32) {
	t.Helper()
	var rc uint32
	out := skbCtx{}
	err := e.ns.Do(func() error {
		var err error
		rc, err = prog.Run(&ebpf.RunOptions{
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
	for _, p := range []string{"maps/cfg_by_ifindex", "maps/flows", "maps/events", "maps/learned_of", "progs/from_sbx", "links/0/ingress", "links/0/egress"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("pinned %s missing: %v", p, err)
		}
	}
	_ = time.Second
}

func netIfindex(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, err
	}
	return ifc.Index, nil
}
