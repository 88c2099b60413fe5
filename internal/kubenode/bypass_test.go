package kubenode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/sdk"
)

// bypassCIDR is the range the bypass sandbox's policy allows by address: the rogue
// resolver and DoT server (bypassRogue) lie inside it, so only egressd's DNS rules (not
// the policy's default deny) can refuse them.
const bypassCIDR = "198.51.100.0/24"

// bypassRogue is the rogue servers' address, put on the node's bridge by checkBypass:
// they answer on TCP 53, 853 and 8080 and UDP 53, so a flow egressd let through would
// succeed ("ok"), and TCP 8080 (no DNS port) shows the address itself is allowed.
const bypassRogue = "198.51.100.10"

// bypass is one attempt of egressd's bypass suite (egressd/egressd_linux_test.go,
// "bypass attempts are blocked and audited") from a pod: what, the protocol and the
// destination, and the audit reason egressd gives when it gives one.
type bypass struct {
	what   string
	proto  string
	addr   netip.Addr
	port   int
	reason string
}

// checkBypass runs egressd's bypass suite from a real sandbox pod on the node: a
// sandbox whose policy allows one name and bypassCIDR tries every class of way around
// egressd's DNS filter and policy (another resolver over UDP and TCP inside the allowed
// range, DoT, the cloud metadata address, the cluster DNS directly, the node's kubelet, a
// rebinding answer, a TXT query, raw sockets and route changes as root). Each connection
// fails at once with EPERM (egressd's socket layer on the pod's cgroup), and egressd's
// audit log on the node holds exactly one deny record per denied flow (20 datagrams of
// one socket are one record counting 20 packets).
func checkBypass(ctx context.Context, t *testing.T, n *Node, c *sdk.Client) {
	ns := n.Namespace(t, "bypass")
	allowed := dnsName(t, n, ns, "allowed", "198.51.100.7")
	rebind := dnsName(t, n, ns, "rebind", "10.0.0.1") // a private answer for a public name
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q},{"action":"allow","target":%q},{"action":"allow","target":%q}]}`,
		allowed, rebind, bypassCIDR)
	rogue := netip.MustParseAddr(bypassRogue)
	serveRogue(t, rogue)
	id := runningSandbox(ctx, t, c, policy, "tail", "-f", "/dev/null")
	run := func(cmd string) string { return runIn(ctx, t, c, id, cmd) }
	resolver := run(`awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf`)
	if _, err := netip.ParseAddr(resolver); err != nil {
		t.Fatalf("the pod's resolver %q: %v", resolver, err)
	}
	if got := run("getent hosts " + allowed + " | cut -d' ' -f1"); got != "198.51.100.7" {
		t.Fatalf("the allowed name %s resolves to %q through egressd (%s), want 198.51.100.7", allowed, got, resolver)
	}

	// The control: the rogue address on a port that is no DNS port is reachable.
	if got := podAttempt(ctx, t, c, id, "tcp", rogue, 8080); got != "ok" {
		t.Fatalf("tcp %s:8080 (allowed by the policy's CIDR) from the pod: %s, want ok", rogue, got)
	}
	classes := []bypass{
		{"UDP query to another resolver", "udp", rogue, 53, "dns_not_resolver"},
		{"TCP 53 to another resolver", "tcp", rogue, 53, ""},
		{"DoT port 853", "tcp", rogue, 853, "dot"},
		{"cloud metadata", "tcp", netip.MustParseAddr("169.254.169.254"), 80, ""},
		{"the cluster DNS directly", "udp", netip.MustParseAddr(DNSIP), 53, ""},
		{"the node's kubelet", "tcp", netip.MustParseAddr(NodeIP), 10250, ""},
	}
	for _, b := range classes {
		if got := podAttempt(ctx, t, c, id, b.proto, b.addr, b.port); got != "eperm" {
			t.Errorf("%s (%s %s:%d) from the pod: %s, want eperm (refused at once by egressd's socket layer)",
				b.what, b.proto, b.addr, b.port, got)
		} else {
			t.Logf("%s (%s %s:%d): EPERM", b.what, b.proto, b.addr, b.port)
		}
	}
	// Rebinding: an allowed name answering a private address is dropped by the filter.
	if got := run("getent hosts " + rebind + " || echo unresolved"); got != "unresolved" {
		t.Errorf("the rebinding name %s resolved in the pod: %q", rebind, got)
	}
	// TXT (not in the default query types), asked of egressd's resolver directly.
	txt := `import socket
q=bytes.fromhex('abce01000001000000000000')+b''.join(bytes([len(l)])+l.encode() for l in '%s'.split('.'))+b'\x00\x00\x10\x00\x01'
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)
s.sendto(q,('%s',53))
print(s.recvfrom(512)[0][3]&15)`
	if got := run(`python3 -c "` + fmt.Sprintf(txt, allowed, resolver) + `"`); got != "4" && got != "5" {
		t.Errorf("a TXT query for %s: rcode %q, want NOTIMP (4) or REFUSED (5)", allowed, got)
	}
	// Root in the pod cannot open raw sockets or change routes.
	if got := run(`python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)" 2>/dev/null; echo rc=$?`); got != "rc=1" {
		t.Errorf("a raw socket as root in the pod: %q, want refused (rc=1)", got)
	}
	if got := run(`python3 -c "
import fcntl, socket
s = socket.socket()
try:
    fcntl.ioctl(s, 0x890C, b'\0' * 120)  # SIOCADDRT needs CAP_NET_ADMIN
    print('changed')
except PermissionError:
    print('denied')
except OSError as e:
    print('errno %d' % e.errno)"`); got != "denied" {
		t.Errorf("a route change as root in the pod: %q, want denied", got)
	}
	// One flow of 20 datagrams to one denied destination.
	if got := run(`python3 -c "
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
for i in range(20):
    try: s.sendto(b'x',('169.254.169.254',9999))
    except OSError: pass
print('sent')"`); got != "sent" {
		t.Fatalf("sending the 20 datagrams: %q", got)
	}

	// The audit: once every flow has been idle for the flow window, exactly one deny
	// record per denied flow.
	dir := filepath.Join(StateDir, "egressd", "audit")
	var recs []audit.Record
	n.Wait(t, "egressd's audit records of the bypass attempts", 60*time.Second, func() (bool, error) {
		var err error
		if recs, _, err = audit.Query(dir, audit.Filter{SandboxID: id}); err != nil {
			return false, err
		}
		for _, b := range classes {
			if len(denials(recs, b.proto, b.addr.String(), b.port)) == 0 {
				return false, nil
			}
		}
		return len(denials(recs, "udp", "169.254.169.254", 9999)) > 0, nil
	})
	time.Sleep(3 * datapath.DefaultFlowWindow / 2)
	recs, _, err := audit.Query(dir, audit.Filter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range classes {
		got := denials(recs, b.proto, b.addr.String(), b.port)
		switch {
		case len(got) != 1:
			t.Errorf("%s: %d deny records of the flow %s %s:%d, want exactly 1", b.what, len(got), b.proto, b.addr, b.port)
		case b.reason != "" && got[0].Reason != b.reason:
			t.Errorf("%s: audit reason %q, want %q: %+v", b.what, got[0].Reason, b.reason, got[0])
		}
	}
	if flow := denials(recs, "udp", "169.254.169.254", 9999); len(flow) != 1 {
		t.Errorf("%d records of one denied flow of 20 datagrams, want 1", len(flow))
	} else {
		if p, _ := flow[0].Extra["packets"].(float64); p != 20 {
			t.Errorf("the flow's record counts %v packets, want 20: %+v", flow[0].Extra["packets"], flow[0])
		}
		// Process attribution in the pod: the kernel names python3, a process of an
		// execd command's group (execd is 1 in the pod's pid namespace).
		proc, _ := flow[0].Extra["process"].(map[string]any)
		execution, _ := flow[0].Extra["execution"].(map[string]any)
		if exe, _ := proc["exe_name"].(string); !strings.HasPrefix(exe, "python3") || execution["by"] != "group" {
			t.Errorf("the denied flow's process %v, execution %v; want python3 in a command's group", proc, execution)
		}
		if nsPID, _ := proc["ns_pid"].(float64); nsPID <= 1 {
			t.Errorf("the denied flow's process has no pid in the pod's namespace: %v", proc)
		}
	}
	txtDenied := false
	for _, r := range recs {
		txtDenied = txtDenied || (r.Source == audit.SourceDNS && r.QType == "TXT" && r.Action == "deny")
	}
	if !txtDenied {
		t.Errorf("no DNS deny record of the TXT query among %d records", len(recs))
	}
	t.Logf("bypass: %d audit records of sandbox %s, one deny per denied flow", len(recs), id)
}

// serveRogue puts addr on the node's bridge and accepts TCP connections on its ports 53,
// 853 and 8080 and answers UDP datagrams on port 53 until t ends.
func serveRogue(t *testing.T, addr netip.Addr) {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", addr.String()+"/32", "dev", Bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s dev %s: %v: %s", addr, Bridge, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr.String()+"/32", "dev", Bridge).Run() })
	for _, port := range []string{"53", "853", "8080"} {
		l, err := net.Listen("tcp4", net.JoinHostPort(addr.String(), port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(addr.String(), "53"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// denials are the eBPF deny records among recs of the flow proto dst:port.
func denials(recs []audit.Record, proto, dst string, port int) []audit.Record {
	var out []audit.Record
	for _, r := range recs {
		if r.Source == audit.SourceBPF && r.Action == "deny" && r.Proto == proto && r.DstIP == dst && r.DstPort == port {
			out = append(out, r)
		}
	}
	return out
}

// podAttempt tries one connection from sandbox id (a TCP connect, or a connected UDP
// socket's send and receive) and names the outcome: "eperm" (refused at the socket),
// "reset" (ECONNREFUSED), "unreachable" (EHOSTUNREACH), "timeout" (3 s) or "ok".
func podAttempt(ctx context.Context, t *testing.T, c *sdk.Client, id, proto string, host netip.Addr, port int) string {
	t.Helper()
	py := `import socket,errno
t=socket.SOCK_STREAM if '%s'=='tcp' else socket.SOCK_DGRAM
s=socket.socket(socket.AF_INET,t);s.settimeout(3)
try:
    s.connect(('%s',%d))
    if t==socket.SOCK_DGRAM:
        s.send(b'x');s.recv(512)
    print('ok')
except socket.timeout:
    print('timeout')
except OSError as e:
    print({errno.EPERM:'eperm',errno.ECONNREFUSED:'reset',errno.EHOSTUNREACH:'unreachable'}.get(e.errno,'errno%%d'%%e.errno))`
	return strings.TrimSpace(runIn(ctx, t, c, id, `python3 -c "`+fmt.Sprintf(py, proto, host, port)+`"`))
}
