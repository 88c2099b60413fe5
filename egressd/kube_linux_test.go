package egressd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// A Kubernetes node as a routed CNI (ptp, Calico) builds it, in test-only ranges: each
// pod is a network namespace behind a veth whose host side carries the gateway address
// and a /32 route to the pod's address; a "service" dummy interface on the host holds
// the servers the pods try to reach. Interface and namespace names start with alk8s.
var (
	k8sGateway  = netip.MustParseAddr("10.244.77.1") // on every pod's host veth (ptp)
	k8sPodA     = netip.MustParseAddr("10.244.77.2") // a pod of this node
	k8sPodB     = netip.MustParseAddr("10.244.77.3") // a pod the watch places on another node
	k8sBridged  = netip.MustParseAddr("10.244.78.2") // a pod behind a bridge
	k8sAllowed  = netip.MustParseAddr("10.244.79.1") // allowed by a CIDR rule
	k8sDenied   = netip.MustParseAddr("10.244.79.2") // denied by the default
	k8sLocalDNS = netip.MustParseAddr("169.254.77.53")
)

// k8sName is a unique interface name: alk8s + role letter + 6 hex digits.
func k8sName(role string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return "alk8s" + role + hex.EncodeToString(b[:])
}

// k8sPod is a pod: its namespace, address and the host side of its veth.
type k8sPod struct {
	ns   datapathtest.Netns
	ip   netip.Addr
	veth string
}

// routedPod creates a pod with ip the way the CNI ptp plugin does: eth0 with ip/32 and
// a default route via the gateway; on the host, the gateway address on the host veth
// and a /32 route to ip through it.
func routedPod(t *testing.T, ip netip.Addr) k8sPod {
	t.Helper()
	p := k8sPod{ns: datapathtest.NewNetns(t, "alk8s"), ip: ip, veth: k8sName("h")}
	datapathtest.IP(t, "link", "add", p.veth, "type", "veth", "peer", "name", "eth0", "netns", p.ns.Name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", p.veth).Run() })
	datapathtest.IP(t, "addr", "add", k8sGateway.String()+"/32", "dev", p.veth)
	datapathtest.IP(t, "link", "set", p.veth, "up")
	datapathtest.IP(t, "route", "add", ip.String()+"/32", "dev", p.veth, "scope", "link")
	datapathtest.IP(t, "-n", p.ns.Name, "addr", "add", ip.String()+"/32", "dev", "eth0")
	datapathtest.IP(t, "-n", p.ns.Name, "link", "set", "eth0", "up")
	datapathtest.IP(t, "-n", p.ns.Name, "route", "add", k8sGateway.String(), "dev", "eth0", "scope", "link")
	datapathtest.IP(t, "-n", p.ns.Name, "route", "add", "default", "via", k8sGateway.String(), "dev", "eth0")
	return p
}

// bridgedPod creates a pod behind a bridge (the CNI bridge plugin): the host routes the
// pod's /24 through the bridge, not through the pod's veth.
func bridgedPod(t *testing.T, ip netip.Addr) k8sPod {
	t.Helper()
	br := k8sName("b")
	datapathtest.IP(t, "link", "add", br, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", br).Run() })
	datapathtest.IP(t, "addr", "add", "10.244.78.1/24", "dev", br)
	datapathtest.IP(t, "link", "set", br, "up")
	p := k8sPod{ns: datapathtest.NewNetns(t, "alk8s"), ip: ip, veth: k8sName("p")}
	datapathtest.IP(t, "link", "add", p.veth, "type", "veth", "peer", "name", "eth0", "netns", p.ns.Name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", p.veth).Run() })
	datapathtest.IP(t, "link", "set", p.veth, "master", br, "up")
	datapathtest.IP(t, "-n", p.ns.Name, "addr", "add", ip.String()+"/24", "dev", "eth0")
	datapathtest.IP(t, "-n", p.ns.Name, "link", "set", "eth0", "up")
	datapathtest.IP(t, "-n", p.ns.Name, "route", "add", "default", "via", "10.244.78.1")
	return p
}

// k8sServers puts k8sAllowed and k8sDenied on an interface of the host, each with
// a TCP server that writes "hello", and a rogue DNS server on k8sAllowed:53 that answers
// every name. It returns the TCP port (the same on both addresses).
func k8sServers(t *testing.T) int {
	t.Helper()
	dev := k8sName("s")
	datapathtest.IP(t, "link", "add", dev, "type", "bridge") // no ports: a holder of addresses
	t.Cleanup(func() { exec.Command("ip", "link", "del", dev).Run() })
	for _, a := range []netip.Addr{k8sAllowed, k8sDenied} {
		datapathtest.IP(t, "addr", "add", a.String()+"/32", "dev", dev)
	}
	datapathtest.IP(t, "link", "set", dev, "up")
	l, err := net.Listen("tcp", netip.AddrPortFrom(k8sAllowed, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	l2, err := net.Listen("tcp", netip.AddrPortFrom(k8sDenied, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l2.Close() })
	for _, l := range []net.Listener{l, l2} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(c, "hello")
				c.Close()
			}
		}()
	}
	pc, err := net.ListenPacket("udp", netip.AddrPortFrom(k8sAllowed, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go dns.ActivateAndServe(nil, pc, dns.HandlerFunc(answerAll(k8sDenied)))
	return port
}

// fetch connects from the pod to addr:port and reads what the server writes.
func (p k8sPod) fetch(addr netip.Addr, port int) (string, error) {
	c, err := p.ns.Dial("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// query asks server (addr:53) for name's A record from inside the pod.
func (p k8sPod) query(server netip.Addr, name string) (*dns.Msg, error) {
	var r *dns.Msg
	err := p.ns.Do(func() error {
		c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		var err error
		r, _, err = c.Exchange(m, netip.AddrPortFrom(server, 53).String())
		return err
	})
	return r, err
}

func TestPodVeth(t *testing.T) {
	testenv.NeedRoot(t)
	pod := routedPod(t, k8sPodA)
	bridged := bridgedPod(t, k8sBridged)
	k8sServers(t)
	// A pod of another node (flannel host-gw: its node is the gateway) and a prefix
	// through a veth that is not a host route.
	datapathtest.IP(t, "route", "add", "10.244.91.9/32", "via", k8sPodA.String(), "dev", pod.veth, "onlink")
	datapathtest.IP(t, "route", "add", "10.244.92.0/24", "dev", pod.veth)
	cases := []struct {
		name string
		addr netip.Addr
		want string // the error's telling part; "" = found pod.veth
	}{
		{"routed", k8sPodA, ""},
		{"routedMapped", netip.AddrFrom16(k8sPodA.As16()), ""},
		{"bridge", k8sBridged, "routed through bridge"},
		{"gateway", netip.MustParseAddr("10.244.91.9"), "via gateway " + k8sPodA.String()},
		{"notHostRoute", netip.MustParseAddr("10.244.92.5"), "not a host route"},
		{"local", k8sAllowed, "not routed to a pod"},
		// No route of its own: the default route, or none at all.
		{"noRoute", netip.MustParseAddr("10.244.93.9"), ""},
		{"invalid", netip.Addr{}, "no address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx, name, err := podVeth(tc.addr)
			if tc.name != "noRoute" && tc.want == "" {
				l, lerr := netlink.LinkByName(pod.veth)
				if lerr != nil {
					t.Fatal(lerr)
				}
				if err != nil || idx != l.Attrs().Index || name != pod.veth {
					t.Fatalf("podVeth(%s) = %d, %q, %v; want %d, %q", tc.addr, idx, name, err, l.Attrs().Index, pod.veth)
				}
				return
			}
			if !errors.Is(err, ErrPodRoute) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("podVeth(%s) = %d, %q, %v; want ErrPodRoute naming %q", tc.addr, idx, name, err, tc.want)
			}
			if name == bridged.veth || idx != 0 {
				t.Fatalf("podVeth(%s) named an interface on error: %d %q", tc.addr, idx, name)
			}
		})
	}
}

func TestEnsureDNSAddress(t *testing.T) {
	testenv.NeedRoot(t)
	dev := k8sName("d")
	t.Cleanup(func() { exec.Command("ip", "link", "del", dev).Run() })
	for i := range 2 { // the second call finds everything in place
		if err := EnsureDNSAddress(dev, k8sLocalDNS); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	want := "dummy"
	if !dummySupported(t) {
		want = "bridge"
	}
	if l.Type() != want || l.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("%s: type %s flags %v, want an up %s", dev, l.Type(), l.Attrs().Flags, want)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != k8sLocalDNS.String()+"/32" {
		t.Fatalf("%s IPv4 addresses = %v, want only %s/32", dev, addrs, k8sLocalDNS)
	}
	// A DNS server bound there answers.
	up := dnstest.Zone(map[string]netip.Addr{"here.k8s.test.": k8sAllowed}, 60)
	pc, err := net.ListenPacket("udp", netip.AddrPortFrom(k8sLocalDNS, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go dns.ActivateAndServe(nil, pc, up)
	m := new(dns.Msg)
	m.SetQuestion("here.k8s.test.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, pc.LocalAddr().String())
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("query on %s: %v %v", pc.LocalAddr(), r, err)
	}

	t.Run("notDummy", func(t *testing.T) {
		other := k8sName("v")
		datapathtest.IP(t, "link", "add", other, "type", "veth", "peer", "name", other+"x")
		t.Cleanup(func() { exec.Command("ip", "link", "del", other).Run() })
		err := EnsureDNSAddress(other, k8sLocalDNS)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "not a dummy") {
			t.Fatalf("EnsureDNSAddress on a veth = %v, want ErrConfig (not a dummy)", err)
		}
		l, _ := netlink.LinkByName(other)
		if as, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(as) != 0 {
			t.Fatalf("addresses added to %s: %v", other, as)
		}
	})
	t.Run("bridgeWithPorts", func(t *testing.T) {
		br, port := k8sName("b"), k8sName("v")
		datapathtest.IP(t, "link", "add", br, "type", "bridge")
		t.Cleanup(func() { exec.Command("ip", "link", "del", br).Run() })
		datapathtest.IP(t, "link", "add", port, "type", "veth", "peer", "name", port+"x")
		t.Cleanup(func() { exec.Command("ip", "link", "del", port).Run() })
		datapathtest.IP(t, "link", "set", port, "master", br)
		err := EnsureDNSAddress(br, k8sLocalDNS)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "bridge with ports") {
			t.Fatalf("EnsureDNSAddress on a bridge with a port = %v, want ErrConfig", err)
		}
	})
	t.Run("badInput", func(t *testing.T) {
		for _, c := range []struct {
			ifname string
			addr   netip.Addr
		}{
			{k8sName("x"), netip.Addr{}},
			{k8sName("x"), netip.IPv4Unspecified()},
			{k8sName("x"), netip.MustParseAddr("224.0.0.1")},
			{"", k8sLocalDNS},
			{"alk8s-name-too-long", k8sLocalDNS},
		} {
			if err := EnsureDNSAddress(c.ifname, c.addr); !errors.Is(err, ErrConfig) {
				t.Errorf("EnsureDNSAddress(%q, %v) = %v, want ErrConfig", c.ifname, c.addr, err)
			}
			if _, err := netlink.LinkByName(c.ifname); err == nil && c.ifname != "" {
				exec.Command("ip", "link", "del", c.ifname).Run()
				t.Errorf("%s created on bad input", c.ifname)
			}
		}
	})
}

// TestEgressdKubernetesPods runs egressd as the DaemonSet does, once per backend: it
// follows a watch stream of pods (Runtime.Kind kubernetes, no pid, no interface, the
// pod IP as address) with Node = this node, finds each pod's host veth from the route
// to its IP, serves DNS on a node-local address, and leaves other nodes' pods and a
// bridged pod alone.
func TestEgressdKubernetesPods(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedBPF(t)
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) { kubernetesPods(t, mode) })
	}
}

func kubernetesPods(t *testing.T, mode enforcer.Mode) {
	port := k8sServers(t)
	podA, podB := routedPod(t, k8sPodA), routedPod(t, k8sPodB)
	bridged := bridgedPod(t, k8sBridged)
	// Before egressd: the pod reaches both servers (the topology works).
	for _, a := range []netip.Addr{k8sAllowed, k8sDenied} {
		if got, err := podA.fetch(a, port); got != "hello" {
			t.Fatalf("before egressd, pod → %s: %q %v", a, got, err)
		}
	}

	hub := watch.NewHub(0, nil)
	srv := httptest.NewServer(hub)
	t.Cleanup(srv.Close)
	auditDir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: auditDir, SyncInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { aw.Close() })
	var logs testenv.SyncBuffer
	dnsDev := k8sName("d")
	t.Cleanup(func() { exec.Command("ip", "link", "del", dnsDev).Run() })
	d, err := New(Config{
		Watch:        watch.ClientConfig{URL: srv.URL + "/internal/v1/watch"},
		Enforcer:     enforcer.Config{Mode: mode, EBPF: EBPFBackend(pinRoot(t)), NFT: nftfilter.Config{Table: nfttest.Table(t)}},
		LocalDNS:     k8sLocalDNS,
		DNSInterface: dnsDev,
		Upstreams:    []string{dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{"ok.k8s.test.": netip.MustParseAddr("192.0.2.77")}, 60))},
		Node:         "node-a",
		Audit:        aw,
		Registry:     prometheus.NewRegistry(),
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Backend()) != string(mode) {
		d.Close()
		t.Fatalf("backend = %s, want %s", d.Backend(), mode)
	}
	if got := d.DNSAddr(); got != netip.AddrPortFrom(k8sLocalDNS, 53) {
		d.Close()
		t.Fatalf("DNS filter on %s, want %s:53", got, k8sLocalDNS)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	pod := func(id, node string, ip netip.Addr) watch.Sandbox {
		return watch.Sandbox{
			ID: id + "-" + sfx, State: "Running", Address: ip, Node: node,
			Runtime: watch.Runtime{Kind: RuntimeKubernetes, ContainerID: "uid-" + id},
			Policy: []byte(`{"defaultAction":"deny","egress":[` +
				`{"action":"allow","target":"` + k8sAllowed.String() + `"},{"action":"allow","target":"ok.k8s.test"}]}`),
			PolicyVersion: 1,
		}
	}
	a, other, br := pod("k8s-a", "node-a", k8sPodA), pod("k8s-b", "node-b", k8sPodB), pod("k8s-br", "node-a", k8sBridged)
	// Published first: by the time a is attached, egressd has seen the others.
	hub.Put(other)
	hub.Put(br)
	hub.Put(a)
	waitAttached(t, d, a.ID, true)
	t.Cleanup(func() {
		hub.Delete(a.ID)
		waitAttached(t, d, a.ID, false)
	})

	d.mu.RLock()
	veth, otherHeld := d.byID[a.ID].veth, d.byID[other.ID] != nil
	d.mu.RUnlock()
	if veth != podA.veth {
		t.Fatalf("pod a attached to %q, want its host veth %s", veth, podA.veth)
	}
	if otherHeld || d.Enforced(other.ID) {
		t.Fatalf("a pod of node-b is held by node-a's egressd")
	}
	if got := d.Datapath().Attached(); !slices.Equal(got, []string{a.ID}) {
		t.Fatalf("datapath attached %v, want only %s", got, a.ID)
	}
	// The status route lifecycle replicas ask before releasing a pod's entrypoint.
	status := httptest.NewServer(d.StatusHandler())
	defer status.Close()
	for id, want := range map[string]int{a.ID: http.StatusOK, other.ID: http.StatusNotFound, br.ID: http.StatusNotFound} {
		resp, err := http.Get(status.URL + watch.EnforcedPath + id)
		if err != nil {
			t.Fatal(err)
		}
		var got watch.Enforced
		_ = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusOK && (got.SandboxID != id || got.PolicyVersion != 1)) {
			t.Fatalf("status of %s: %d %+v, want %d", id, resp.StatusCode, got, want)
		}
	}

	t.Run("policy", func(t *testing.T) {
		if got, err := podA.fetch(k8sAllowed, port); got != "hello" {
			t.Fatalf("allowed CIDR: %q %v", got, err)
		}
		// nftables refuses with a reset; eBPF drops on the veth, silently: a pod has no
		// process egressd sees, so no cgroup for the EPERM layer.
		got, err := podA.fetch(k8sDenied, port)
		var ne net.Error
		switch {
		case err == nil:
			t.Fatalf("denied address reached: %q", got)
		case mode == enforcer.ModeNFTables && !errors.Is(err, syscall.ECONNREFUSED):
			t.Fatalf("denied connect: %v, want a reset", err)
		case mode == enforcer.ModeEBPF && !(errors.As(err, &ne) && ne.Timeout()):
			t.Fatalf("denied connect: %v, want a drop (timeout)", err)
		}
		rec := waitAuditRecord(t, auditDir, a.ID, func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstIP == k8sDenied.String()
		})
		if rec.Extra["backend"] != string(mode) {
			t.Errorf("deny record backend = %v, want %s", rec.Extra["backend"], mode)
		}
	})
	t.Run("dns", func(t *testing.T) {
		r, err := podA.query(k8sLocalDNS, "ok.k8s.test.")
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("allowed name through the node-local address: %v %v", r, err)
		}
		r, err = podA.query(k8sLocalDNS, "no.k8s.test.")
		if err != nil || r.Rcode != dns.RcodeNameError {
			t.Fatalf("denied name: %v %v, want NXDOMAIN", r, err)
		}
		// Another resolver, even on an allowed address, is not reachable.
		if r, err := podA.query(k8sAllowed, "ok.k8s.test."); err == nil {
			t.Fatalf("a rogue resolver answered: %v", r)
		}
		waitAuditRecord(t, auditDir, a.ID, func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.DstHost == "ok.k8s.test" && r.Action == "allow"
		})
	})
	t.Run("otherNode", func(t *testing.T) {
		// Nothing on pod b's veth: it reaches what pod a may not.
		if got, err := podB.fetch(k8sDenied, port); got != "hello" {
			t.Fatalf("pod of node-b filtered: %q %v", got, err)
		}
	})
	t.Run("bridge", func(t *testing.T) {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(logs.String(), "routed through bridge") {
			if time.Now().After(deadline) {
				t.Fatalf("no bridge refusal logged:\n%s", logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if d.Enforced(br.ID) || slices.Contains(d.Datapath().Attached(), br.ID) {
			t.Fatalf("bridged pod attached")
		}
		// Nothing filters the bridged pod (it is reported not enforced instead).
		if got, err := bridged.fetch(k8sDenied, port); got != "hello" {
			t.Fatalf("bridged pod filtered: %q %v", got, err)
		}
	})
}

// waitAuditRecord waits for an audit record of sandbox id matching pred in dir.
func waitAuditRecord(t *testing.T, dir, id string, pred func(audit.Record) bool) audit.Record {
	t.Helper()
	return (&world{auditDir: dir}).waitAudit(t, id, "a matching record", pred)
}

// dummySupported reports whether the kernel can create dummy interfaces.
func dummySupported(t *testing.T) bool {
	name := k8sName("y")
	if exec.Command("ip", "link", "add", name, "type", "dummy").Run() != nil {
		return false
	}
	exec.Command("ip", "link", "del", name).Run()
	return true
}
