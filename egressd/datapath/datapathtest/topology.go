package datapathtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// Fixed addresses of the topology.
var (
	Gateway4  = netip.MustParseAddr("10.77.0.1")
	Gateway6  = netip.MustParseAddr("fd77::1")
	Sandbox4  = netip.MustParseAddr("10.77.0.2")
	Sandbox6  = netip.MustParseAddr("fd77::2")
	Static4   = netip.MustParseAddr("198.18.1.1") // for static CIDR rules
	Learned4  = netip.MustParseAddr("198.18.2.1") // for Learn
	Unknown4  = netip.MustParseAddr("198.18.3.1") // never allowed
	Foreign4  = netip.MustParseAddr("198.18.4.1") // a resolver that is not egressd's
	Internet6 = netip.MustParseAddr("2001:db8:1::1")
)

// ServerTCPPorts are served (line echo) on every internet address; SinkPort discards.
var ServerTCPPorts = []int{22, 53, 80, 443, 853, 8080}

const (
	SinkPort   = 9999
	UDPPort    = 5353 // UDP echo on every internet address
	InboundTCP = 9000 // sandbox-side echo server the host connects to
)

// Topology is the three-namespace test network; see the package doc.
type Topology struct {
	Host, Sandbox, Internet Netns
	// HostIfname/HostIfindex name the host side of the sandbox's veth (in Host).
	HostIfname  string
	HostIfindex int
}

// NewTopology builds the topology and starts the servers; everything is removed at
// test cleanup.
func NewTopology(t testing.TB) *Topology {
	t.Helper()
	tp := &Topology{
		Host:       NewNetns(t, "alh-"),
		Sandbox:    NewNetns(t, "als-"),
		Internet:   NewNetns(t, "ali-"),
		HostIfname: "alh0",
	}
	h, s, i := tp.Host.Name, tp.Sandbox.Name, tp.Internet.Name
	// sandbox <-> host bridge
	IP(t, "-n", h, "link", "add", "alb0", "type", "bridge")
	IP(t, "-n", h, "addr", "add", "10.77.0.1/24", "dev", "alb0")
	IP(t, "-n", h, "addr", "add", "fd77::1/64", "dev", "alb0", "nodad")
	IP(t, "-n", h, "link", "set", "alb0", "up")
	IP(t, "-n", h, "link", "add", "alh0", "type", "veth", "peer", "name", "eth0", "netns", s)
	IP(t, "-n", h, "link", "set", "alh0", "master", "alb0")
	IP(t, "-n", h, "link", "set", "alh0", "up")
	IP(t, "-n", s, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	IP(t, "-n", s, "addr", "add", "fd77::2/64", "dev", "eth0", "nodad")
	IP(t, "-n", s, "link", "set", "eth0", "up")
	IP(t, "-n", s, "route", "add", "default", "via", "10.77.0.1")
	IP(t, "-n", s, "-6", "route", "add", "default", "via", "fd77::1")
	// host <-> internet
	IP(t, "-n", h, "link", "add", "ali0", "type", "veth", "peer", "name", "eth0", "netns", i)
	IP(t, "-n", h, "addr", "add", "10.88.0.1/30", "dev", "ali0")
	IP(t, "-n", h, "addr", "add", "fd88::1/64", "dev", "ali0", "nodad")
	IP(t, "-n", h, "link", "set", "ali0", "up")
	IP(t, "-n", i, "addr", "add", "10.88.0.2/30", "dev", "eth0")
	IP(t, "-n", i, "addr", "add", "fd88::2/64", "dev", "eth0", "nodad")
	IP(t, "-n", i, "link", "set", "eth0", "up")
	for _, a := range []netip.Addr{Static4, Learned4, Unknown4, Foreign4} {
		IP(t, "-n", i, "addr", "add", a.String()+"/32", "dev", "lo")
	}
	IP(t, "-n", i, "addr", "add", Internet6.String()+"/128", "dev", "lo", "nodad")
	IP(t, "-n", i, "route", "add", "default", "via", "10.88.0.1")
	IP(t, "-n", i, "-6", "route", "add", "default", "via", "fd88::1")
	IP(t, "-n", h, "route", "add", "198.18.0.0/16", "via", "10.88.0.2")
	IP(t, "-n", h, "-6", "route", "add", "2001:db8::/32", "via", "fd88::2")
	tp.Host.Sysctl(t, "net.ipv4.ip_forward", "1")
	tp.Host.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")

	err := tp.Host.Do(func() error {
		ifc, err := net.InterfaceByName(tp.HostIfname)
		if err != nil {
			return err
		}
		tp.HostIfindex = ifc.Index
		return nil
	})
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}

	for _, p := range ServerTCPPorts {
		tp.serveTCP(t, tp.Internet, ":"+strconv.Itoa(p), echoLines)
	}
	tp.serveTCP(t, tp.Internet, ":"+strconv.Itoa(SinkPort), func(c net.Conn) { io.Copy(io.Discard, c) })
	tp.serveUDP(t, tp.Internet, ":"+strconv.Itoa(UDPPort))
	tp.serveUDP(t, tp.Internet, ":53")
	// egressd's resolver on the bridge gateway (UDP and TCP 53).
	tp.serveUDP(t, tp.Host, ":53")
	tp.serveTCP(t, tp.Host, ":53", echoLines)
	tp.serveTCP(t, tp.Sandbox, ":"+strconv.Itoa(InboundTCP), echoLines)
	return tp
}

func echoLines(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

func (tp *Topology) serveTCP(t testing.TB, ns Netns, addr string, handle func(net.Conn)) {
	t.Helper()
	l, err := ns.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
}

func (tp *Topology) serveUDP(t testing.TB, ns Netns, addr string) {
	t.Helper()
	pc, err := ns.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("listen udp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// Reach dials addr:port over TCP from the sandbox and round-trips one line. It
// returns nil when the server answered.
func (tp *Topology) Reach(addr netip.Addr, port int, timeout time.Duration) error {
	c, err := tp.Sandbox.Dial("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return RoundTrip(c, timeout)
}

// RoundTrip writes one line on an echo connection and reads it back.
func RoundTrip(c net.Conn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo answered %q", line)
	}
	return nil
}
