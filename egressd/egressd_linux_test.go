package egressd

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

const startPolicy = `{"defaultAction":"deny","egress":[
 {"action":"allow","target":"allowed.test"},
 {"action":"allow","target":"198.51.100.0/24"}]}`

// changedPolicy (Airlock form) flips the names and narrows the CIDR to one port.
const changedPolicy = `{"defaultAction":"deny","egress":[
 {"action":"allow","target":"denied.test"},
 {"action":"allow","target":"198.51.100.10","ports":[8080],"protocols":["tcp"]}]}`

// TestEgressdEnforcesRealSandboxes runs the whole suite once per backend: real
// sandboxes on a real Docker engine, resolving through egressd, reaching servers in a
// namespace routed from the host.
func TestEgressdEnforcesRealSandboxes(t *testing.T) {
	w := newWorld(t)
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) { w.suite(t, mode) })
	}
}

func (w *world) suite(t *testing.T, mode enforcer.Mode) {
	outer := t // daemons live as long as the suite, not one subtest
	pins := pinRoot(t)
	d, stop := w.daemon(t, mode, pins)
	sb, x := w.create(t, d, startPolicy)

	t.Run("allowed name resolves and connects", func(t *testing.T) {
		if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
			t.Fatalf("allowed.test = %q", got)
		}
		w.waitAudit(t, sb.ID, "dns allow allowed.test", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.DstHost == "allowed.test" && r.Action == "allow"
		})
		w.waitAudit(t, sb.ID, "new flow to allowed.test", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "allow" && r.DstIP == allowedIP.String() && r.DstPort == 80
		})
	})
	t.Run("denied name is NXDOMAIN and its address unreachable", func(t *testing.T) {
		if code, out := sh(t, x, "getent hosts denied.test"); code == 0 {
			t.Fatalf("denied.test resolved: %s", out)
		}
		if got := curl(t, x, "http://"+deniedIP.String()+"/"); got != "" {
			t.Fatalf("dialling the never-resolved address worked: %q", got)
		}
		w.waitAudit(t, sb.ID, "dns deny denied.test", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.DstHost == "denied.test" && r.Action == "deny"
		})
		w.waitAudit(t, sb.ID, "drop to the never-resolved address", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstIP == deniedIP.String()
		})
	})
	t.Run("CIDR rule", func(t *testing.T) {
		if got := curl(t, x, "http://"+cidrIP.String()+":8080/"); got != "cidr" {
			t.Fatalf("CIDR-allowed server = %q", got)
		}
		// audit: all (the default): the allowed flow is one record, with what the
		// sandbox sent when the backend counts it (eBPF).
		rec := w.waitAudit(t, sb.ID, "the allowed flow", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "allow" && r.DstIP == cidrIP.String() && r.DstPort == 8080
		})
		if mode == enforcer.ModeEBPF {
			if p, _ := rec.Extra["packets"].(float64); p < 3 {
				t.Errorf("allowed flow record counts %v packets, want the connection's (≥ 3): %+v", rec.Extra["packets"], rec)
			}
			if b, _ := rec.Extra["bytes"].(float64); b < 100 {
				t.Errorf("allowed flow record counts %v bytes: %+v", rec.Extra["bytes"], rec)
			}
		}
	})
	t.Run("bypass attempts are blocked and audited", func(t *testing.T) {
		// Another resolver, UDP and TCP: the rogue resolver sits inside the allowed CIDR.
		// Every denied attempt fails at once: EPERM (eBPF), a reset or ICMP
		// administratively prohibited (nftables), never a timeout.
		for _, c := range []struct {
			what  string
			proto string
			addr  netip.Addr
			port  int
		}{
			{"UDP query to another resolver", "udp", cidrIP, 53},
			{"TCP 53 to another resolver", "tcp", cidrIP, 53},
			{"DoT port 853", "tcp", cidrIP, 853},
			{"cloud metadata", "tcp", netip.MustParseAddr("169.254.169.254"), 80},
			{"the host", "tcp", w.gw, w.hostPort},
		} {
			if got, want := attempt(t, x, c.proto, c.addr, c.port), refusal(mode, c.proto); got != want {
				t.Errorf("%s: %s, want %s", c.what, got, want)
			}
		}
		// Rebinding: an allowed-by-CIDR-free name answering a private address is dropped.
		if code, out := sh(t, x, "getent hosts rebind.test"); code == 0 {
			t.Errorf("rebind.test resolved: %s", out)
		}
		// TXT (not in the default query types), asked of the real resolver directly.
		txt := `import socket
q=bytes.fromhex('abce01000001000000000000')+b'\x07allowed\x04test\x00\x00\x10\x00\x01'
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)
s.sendto(q,('%s',53))
print(s.recvfrom(512)[0][3]&15)`
		if code, out := sh(t, x, "python3 -c \""+fmt.Sprintf(txt, w.gw)+"\""); code != 0 || (out != "4" && out != "5") {
			t.Errorf("TXT query: exit %d rcode %q, want NOTIMP (4) or REFUSED (5)", code, out)
		}
		// Root inside the sandbox cannot open raw sockets or change routes (caps dropped).
		if code, out := sh(t, x, `python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)" 2>&1; echo rc=$?`); !strings.Contains(out, "rc=1") {
			t.Errorf("raw socket opened as root: exit %d %s", code, out)
		}
		if _, out := sh(t, x, `python3 -c "
import fcntl, socket, struct
s = socket.socket()
try:
    fcntl.ioctl(s, 0x890C, b'\0' * 120)  # SIOCADDRT needs CAP_NET_ADMIN
    print('changed')
except PermissionError:
    print('denied')
except OSError as e:
    print({1: 'denied', 25: 'unsupported'}.get(e.errno, 'errno %d' % e.errno))"`); out != "denied" && (!w.gvisor || out != "unsupported") {
			// gVisor's Sentry answers ENOTTY: it does not pass route ioctls to the host.
			t.Errorf("route change as root: %s", out)
		}
		for _, c := range []struct {
			what   string
			port   int
			reason string
		}{{"udp 53 to another resolver", 53, "dns_not_resolver"}, {"dot", 853, "dot"}} {
			w.waitAudit(t, sb.ID, c.what, func(r audit.Record) bool {
				return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstPort == c.port && r.Reason == c.reason
			})
		}
		w.waitAudit(t, sb.ID, "metadata drop", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstIP == "169.254.169.254"
		})
		w.waitAudit(t, sb.ID, "TXT denial", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.QType == "TXT" && r.Action == "deny"
		})
		// Each denied attempt above is one flow: exactly one record each, once written.
		time.Sleep(3 * datapath.DefaultFlowWindow / 2)
		recs, _, err := audit.Query(w.auditDir, audit.Filter{SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			proto string
			addr  netip.Addr
			port  int
		}{{"udp", cidrIP, 53}, {"tcp", cidrIP, 53}, {"tcp", cidrIP, 853}, {"tcp", netip.MustParseAddr("169.254.169.254"), 80}, {"tcp", w.gw, w.hostPort}} {
			n := 0
			for _, r := range recs {
				if r.Source == audit.SourceBPF && r.Action == "deny" && r.Proto == c.proto && r.DstIP == c.addr.String() && r.DstPort == c.port {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s %s:%d: %d deny records, want exactly 1", c.proto, c.addr, c.port, n)
			}
		}
	})
	t.Run("one audit record per denied flow", func(t *testing.T) {
		// 20 datagrams of one socket to one denied destination are one flow: one
		// record counting 20 packets (refused sends on eBPF, dropped packets on
		// nftables), written once the flow has been idle for the flow window.
		py := `import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
for i in range(20):
    try: s.sendto(b'x',('169.254.169.254',9999))
    except OSError: pass`
		if code, out := sh(t, x, "python3 -c \""+py+"\""); code != 0 {
			t.Fatalf("sending: exit %d %s", code, out)
		}
		isFlow := func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstPort == 9999
		}
		rec := w.waitAudit(t, sb.ID, "the denied flow", isFlow)
		if p, _ := rec.Extra["packets"].(float64); p != 20 {
			t.Errorf("flow record counts %v packets, want 20: %+v", rec.Extra["packets"], rec)
		}
		if _, ok := rec.Extra["last_seen"].(string); !ok {
			t.Errorf("flow record without last_seen: %+v", rec)
		}
		time.Sleep(3 * datapath.DefaultFlowWindow / 2)
		recs, _, err := audit.Query(w.auditDir, audit.Filter{SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if isFlow(r) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d records of one denied flow, want 1", n)
		}
	})
	t.Run("policy change on a running sandbox", func(t *testing.T) {
		before := curl(t, x, "http://allowed.test/") // learned, flow established then closed
		if before != "allowed" {
			t.Fatalf("allowed.test before the change = %q", before)
		}
		w.changePolicy(t, sb.ID, x)
		if code, _ := sh(t, x, "getent hosts allowed.test"); code == 0 {
			t.Errorf("allowed.test still resolves after the change")
		}
		if got := curl(t, x, "http://"+cidrIP.String()+":8080/"); got != "cidr" {
			t.Errorf("port rule: 8080 = %q", got)
		}
		if got := curl(t, x, "http://"+cidrIP.String()+":8081/"); got != "" {
			t.Errorf("port rule: 8081 reachable: %q", got)
		}
	})
	t.Run("fail closed while egressd is stopped, adopted on restart", func(t *testing.T) {
		if curl(t, x, "http://denied.test/") != "denied" { // learn denied.test again
			t.Fatal("denied.test unreachable before the stop")
		}
		stop()
		if got := curl(t, x, "http://"+allowedIP.String()+"/"); got != "" {
			t.Errorf("a denied address became reachable with egressd stopped: %q", got)
		}
		if got := curl(t, x, "http://"+deniedIP.String()+"/"); got != "denied" {
			t.Errorf("a learned address stopped working with egressd stopped: %q", got)
		}
		d2, _ := w.daemon(outer, mode, pins)
		found := false
		for _, id := range d2.Datapath().Attached() {
			found = found || id == sb.ID
		}
		if !found {
			t.Fatalf("restarted egressd did not adopt %s: %v", sb.ID, d2.Datapath().Attached())
		}
		waitAttached(t, d2, sb.ID, true)
		if got := curl(t, x, "http://denied.test/"); got != "denied" {
			t.Errorf("after restart denied.test (allowed by the changed policy) = %q", got)
		}
		d = d2
	})
	t.Run("delete removes everything", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.api.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		waitAttached(t, d, sb.ID, false)
		st, err := d.Datapath().Stats()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Sandboxes) != 0 {
			t.Errorf("datapath still holds %d sandboxes: %+v", len(st.Sandboxes), st.Sandboxes)
		}
	})
}

// changePolicy replaces sandbox id's startPolicy by changedPolicy and checks from the
// sandbox (x) that it applies: denied.test becomes reachable within 10 s, and the address
// learned for allowed.test no longer is.
func (w *world) changePolicy(t *testing.T, id string, x *sdk.Execd) {
	t.Helper()
	w.putPolicy(t, id, changedPolicy)
	deadline := time.Now().Add(10 * time.Second)
	for curl(t, x, "http://denied.test/") != "denied" {
		if time.Now().After(deadline) {
			t.Fatal("denied.test still unreachable after the policy change")
		}
	}
	if got := curl(t, x, "http://"+allowedIP.String()+"/"); got != "" {
		t.Errorf("the formerly learned address of allowed.test is still reachable: %q", got)
	}
}

// TestEgressdEntrypointStartsEnforced: the first instruction of a sandbox's entrypoint
// already meets its policy (execd holds the entrypoint until egressd enforces it): a
// connection to the host, denied by the overlay, is refused and one to an allowed CIDR
// works, both tried before anything else; and the start leaves no deny record of
// Airlock's own traffic.
func TestEgressdEntrypointStartsEnforced(t *testing.T) {
	w := newWorld(t)
	first := `import socket,errno,time
def attempt(host,port):
    s=socket.socket();s.settimeout(3)
    try:
        s.connect((host,port));return 'ok'
    except socket.timeout:
        return 'timeout'
    except OSError as e:
        return {errno.EPERM:'eperm',errno.ECONNREFUSED:'reset'}.get(e.errno,'errno%%d'%%e.errno)
r=attempt('%s',%d)+' '+attempt('%s',8080)
open('/tmp/first','w').write(r)
time.sleep(100000)`
	script := fmt.Sprintf(first, w.gw, w.hostPort, cidrIP)
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			d, _ := w.daemon(t, mode, pinRoot(t))
			sb, x := w.create(t, d, startPolicy, "python3", "-c", script)
			defer w.api.Kill(context.Background(), sb.ID)
			var out string
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if _, out = sh(t, x, "cat /tmp/first 2>/dev/null"); out != "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the entrypoint wrote nothing")
				}
			}
			if want := refusal(mode, "tcp") + " ok"; out != want {
				t.Errorf("entrypoint's first connections (host, allowed CIDR): %q, want %q", out, want)
			}
			time.Sleep(3 * datapath.DefaultFlowWindow / 2) // open flows written
			w.noOwnTrafficDenied(t)
		})
	}
}

// TestEgressdCleanup creates and deletes many sandboxes per backend and checks that
// nothing of theirs remains: no attached sandbox, no datapath table entry, no pinned
// link (eBPF), no chain or set (nftables).
func TestEgressdCleanup(t *testing.T) {
	w := newWorld(t)
	n := 50
	if testing.Short() {
		n = 10
	}
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			pins := pinRoot(t)
			links := cgroupLinks(t)
			d, _ := w.daemon(t, mode, pins)
			ids := make(chan string, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 4)
			for range n {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					sb, _ := w.create(t, d, startPolicy)
					ids <- sb.ID
				})
			}
			wg.Wait()
			close(ids)
			var all []string
			for id := range ids {
				all = append(all, id)
			}
			if got := len(d.Datapath().Attached()); got != n {
				t.Fatalf("%d sandboxes attached, want %d", got, n)
			}
			w.noOwnTrafficDenied(t)
			if seen := w.leftovers(t, mode, pins, all); len(seen) < n {
				t.Fatalf("the leftover check sees %d objects of %d attached sandboxes: %v", len(seen), n, seen)
			}
			// Both datapaths hook each sandbox's cgroup (nftables: process attribution).
			if got := cgroupLinks(t) - links; got < 4*n {
				t.Fatalf("%d new cgroup links for %d sandboxes", got, n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for _, id := range all {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					if err := w.api.Kill(ctx, id); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for _, id := range all {
				waitAttached(t, d, id, false)
			}
			st, err := d.Datapath().Stats()
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Sandboxes) != 0 {
				t.Errorf("datapath still holds %d sandboxes", len(st.Sandboxes))
			}
			left := w.leftovers(t, mode, pins, all)
			if len(left) != 0 {
				t.Errorf("left behind after deleting %d sandboxes: %v", n, left)
			}
			if got := cgroupLinks(t) - links; got != 0 {
				t.Errorf("%d cgroup links left behind after deleting %d sandboxes", got, n)
			}
		})
	}
}

// leftovers lists the kernel objects that still name one of ids (nftables) or any
// pinned link (eBPF: links are pinned per attached veth).
func (w *world) leftovers(t *testing.T, mode enforcer.Mode, pins string, ids []string) []string {
	var out []string
	if mode == enforcer.ModeEBPF {
		ents, err := os.ReadDir(filepath.Join(pins, "links"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range ents {
			out = append(out, "pinned link "+e.Name())
		}
		return out
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Family: nftables.TableFamilyINet, Name: w.nftTable}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev) // the pre-chains
	if err != nil {
		t.Fatal(err)
	}
	chains = append(chains, pre...)
	sets, err := c.GetSets(tab)
	if err != nil && !strings.Contains(err.Error(), "no such file") {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		if ch.Table.Name == w.nftTable {
			names = append(names, "chain "+ch.Name)
		}
	}
	for _, s := range sets {
		names = append(names, "set "+s.Name)
	}
	for _, name := range names {
		for _, id := range ids {
			if strings.HasSuffix(name, "_"+id) {
				out = append(out, name)
			}
		}
	}
	return out
}

// TestEgressdTTLExpiry: once a learned address's TTL has passed, new connections to it
// are dropped while a connection established before the expiry keeps working.
func TestEgressdTTLExpiry(t *testing.T) {
	w := newWorld(t)
	w.eachBackend(t, startPolicy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		script := `cat > /tmp/held.py <<'PY'
import socket, time
s = socket.create_connection(("allowed.test", 80), timeout=3)
open("/tmp/held.up", "w").close()
time.sleep(5)
s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
print(s.recv(4096).decode().split("\r\n\r\n", 1)[-1])
PY
python3 /tmp/held.py > /tmp/held.out 2>&1 &
# the name was learned just before the held connection was made: wait for it, then
# past the 2 s TTL (a loaded machine may take a while to start python)
for i in $(seq 200); do [ -e /tmp/held.up ] && break; sleep 0.05; done
sleep 3
if curl -sS -m 2 http://` + allowedIP.String() + `/ >/dev/null 2>&1; then echo new=ok; else echo new=dropped; fi
wait
echo established=$(cat /tmp/held.out)`
		_, out := sh(t, x, script)
		if !strings.Contains(out, "new=dropped") {
			t.Errorf("a new connection after the TTL was not dropped: %s", out)
		}
		if !strings.Contains(out, "established=allowed") {
			t.Errorf("the connection established before the TTL did not survive it: %s", out)
		}
	}, func(c *Config) { c.MinTTL, c.MaxTTL = 2*time.Second, 2*time.Second })
}

// TestEgressdL7 runs a policy in L7 mode sni per backend: HTTP and TLS to an allowed
// name pass through the proxy to the real server; a Host header or TLS SNI naming a
// denied domain on the allowed name's address is refused and audited.
func TestEgressdL7(t *testing.T) {
	w := newWorld(t)
	const policy = `{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":"allowed.test"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
			t.Errorf("HTTP to the allowed name through the proxy = %q", got)
		}
		if got := curl(t, x, "-k https://allowed.test/"); got != "allowed-tls" {
			t.Errorf("TLS to the allowed name through the proxy = %q", got)
		}
		if got := curl(t, x, "-H 'Host: denied.test' http://allowed.test/"); got == "allowed" || !strings.Contains(got, "blocked") {
			t.Errorf("a Host naming a denied domain on an allowed address = %q", got)
		}
		if got := curl(t, x, "-k --resolve denied.test:443:"+allowedIP.String()+" https://denied.test/"); got != "" {
			t.Errorf("an SNI naming a denied domain on an allowed address = %q", got)
		}
		for _, proto := range []string{"http", "https"} {
			w.waitAudit(t, sb.ID, "l7 deny over "+proto, func(r audit.Record) bool {
				return r.Source == audit.SourceL7 && r.Action == "deny" && r.DstHost == "denied.test" && r.Proto == proto
			})
		}
		w.waitAudit(t, sb.ID, "l7 allow", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "allow" && r.DstHost == "allowed.test"
		})
		w.l7Bypasses(t, d.Backend(), sb, x)
	}, func(c *Config) { c.L7Port = 15001 })
}

// l7Bypasses is the L7 part of the bypass suite: the allowed name's address stands for
// a CDN address shared with other sites, and the sandbox, having resolved the allowed
// name, tries to reach those other sites past the SNI/Host check.
func (w *world) l7Bypasses(t *testing.T, backend datapath.Backend, sb *sdk.Sandbox, x *sdk.Execd) {
	mode := enforcer.Mode(backend)
	if got := curl(t, x, "http://allowed.test/"); got != "allowed" { // (re)learn the address
		t.Fatalf("allowed.test = %q", got)
	}
	t.Run("bypass_quic_udp_443", func(t *testing.T) {
		// HTTP/3 goes over UDP 443, which the L7 proxy never sees: refused at once.
		if got, want := attempt(t, x, "udp", allowedIP, 443), refusal(mode, "udp"); got != want {
			t.Errorf("UDP 443 to the allowed name's address: %s, want %s", got, want)
		}
		w.waitAudit(t, sb.ID, "deny of UDP 443", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.Proto == "udp" && r.DstIP == allowedIP.String() && r.DstPort == 443
		})
	})
	t.Run("bypass_tls_other_port", func(t *testing.T) {
		// TLS on 8443 is not redirected to the L7 proxy: the name's rule gives no
		// ports, so under l7: sni its address is reachable on TCP 80 and 443 only.
		if got, want := attempt(t, x, "tcp", allowedIP, 8443), refusal(mode, "tcp"); got != want {
			t.Errorf("TCP 8443 to the allowed name's address: %s, want %s", got, want)
		}
		if got := curl(t, x, "-k --resolve denied.test:8443:"+allowedIP.String()+" https://denied.test:8443/"); got != "" {
			t.Errorf("TLS naming a denied domain on port 8443 of the allowed address = %q", got)
		}
		w.waitAudit(t, sb.ID, "deny of TCP 8443", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.Proto == "tcp" && r.DstIP == allowedIP.String() && r.DstPort == 8443
		})
	})
	t.Run("bypass_second_request_other_host", func(t *testing.T) {
		// Three requests on one kept-alive port-80 connection: two for the allowed
		// name (keep-alive keeps working), then one naming another site.
		script := `cat > /tmp/keepalive.py <<'PY'
import socket, http.client
s = socket.create_connection(("allowed.test", 80), timeout=3)
out = []
for h in ["allowed.test", "allowed.test", "other.test"]:
    try:
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % h).encode())
        r = http.client.HTTPResponse(s)
        r.begin()
        out.append("%d:%s" % (r.status, r.read().decode().strip().replace(" ", "_")))
    except Exception as e:
        out.append("closed")
print(" ".join(out))
PY
python3 /tmp/keepalive.py`
		_, out := sh(t, x, script)
		got := strings.Fields(out)
		if len(got) != 3 || got[0] != "200:allowed" || got[1] != "200:allowed" {
			t.Fatalf("two requests for the allowed name on one connection: %q", out)
		}
		if !strings.HasPrefix(got[2], "403:") && got[2] != "closed" {
			t.Errorf("a second request naming another site on the kept-alive connection: %s, want 403 or closed", got[2])
		}
		w.waitAudit(t, sb.ID, "l7 deny of the second request", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "deny" && r.DstHost == "other.test" && r.Proto == "http"
		})
	})
}

// TestEgressdDefaultPolicy: a sandbox created without a networkPolicy reaches public
// names and addresses, never the overlay's or private ones.
func TestEgressdDefaultPolicy(t *testing.T) {
	w := newWorld(t)
	w.eachBackend(t, "", func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if got := curl(t, x, "http://denied.test/"); got != "denied" {
			t.Errorf("a public name without a policy = %q", got)
		}
		if got := curl(t, x, "http://"+cidrIP.String()+":8080/"); got != "cidr" {
			t.Errorf("a public address without a policy = %q", got)
		}
		if got := curl(t, x, "http://169.254.169.254/"); got != "" {
			t.Errorf("cloud metadata without a policy = %q", got)
		}
		if got := curl(t, x, fmt.Sprintf("http://%s:%d/", w.gw, w.hostPort)); got != "" {
			t.Errorf("the host without a policy = %q", got)
		}
	})
}

// TestEgressdExplicitProxy: a sandbox whose policy denies everything but two targets
// reaches the explicit proxy (HTTP_PROXY / HTTPS_PROXY), which applies that policy to
// every request and tunnel, resolves through the DNS filter and audits its decisions.
func TestEgressdExplicitProxy(t *testing.T) {
	w := newWorld(t)
	const policy = `{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"},` +
		`{"action":"allow","target":"rebind.test"},{"action":"allow","target":"198.51.100.10/32"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if got, want := d.ProxyAddr(), netip.AddrPortFrom(w.gw, 3128); got != want {
			t.Fatalf("ProxyAddr = %v, want %v", got, want)
		}
		px := fmt.Sprintf("-x http://%s:3128 ", w.gw)
		if got := curl(t, x, px+"http://allowed.test/"); got != "allowed" {
			t.Errorf("http:// to an allowed name through the proxy = %q", got)
		}
		if got := curl(t, x, px+"-k https://allowed.test/"); got != "allowed-tls" {
			t.Errorf("CONNECT to an allowed name through the proxy = %q", got)
		}
		if got := curl(t, x, px+"http://"+cidrIP.String()+":8080/"); got != "cidr" {
			t.Errorf("an address allowed by a CIDR rule through the proxy = %q", got)
		}
		for _, url := range []string{
			"http://denied.test/",                          // denied name
			"http://" + deniedIP.String() + "/",            // address never allowed
			fmt.Sprintf("http://%s:%d/", w.gw, w.hostPort), // the host (overlay)
			"http://169.254.169.254/",                      // cloud metadata (overlay)
		} {
			if got := curl(t, x, px+url); !strings.Contains(got, "EGRESS_DENIED") {
				t.Errorf("%s through the proxy = %q, want a 403 EGRESS_DENIED", url, got)
			}
		}
		if got := curl(t, x, px+"-k https://denied.test/"); got != "" {
			t.Errorf("CONNECT to a denied name through the proxy = %q", got)
		}
		if got := curl(t, x, px+"http://rebind.test/"); !strings.Contains(got, "UPSTREAM_UNRESOLVED") {
			t.Errorf("an allowed name answering a private address through the proxy = %q", got)
		}
		// Without the proxy the sandbox still reaches only its policy.
		if got := curl(t, x, "http://"+deniedIP.String()+"/"); got != "" {
			t.Errorf("the denied address directly = %q", got)
		}
		explicit := func(r audit.Record) bool { return r.Source == audit.SourceL7 && r.Extra["proxy"] == "explicit" }
		w.waitAudit(t, sb.ID, "proxy allow", func(r audit.Record) bool {
			return explicit(r) && r.Action == "allow" && r.DstHost == "allowed.test" && r.Proto == "https" &&
				r.DstIP == allowedIP.String() && r.DstPort == 443
		})
		w.waitAudit(t, sb.ID, "proxy deny", func(r audit.Record) bool {
			return explicit(r) && r.Action == "deny" && r.DstHost == "denied.test" && r.Proto == "http"
		})
		w.waitAudit(t, sb.ID, "proxy deny of the host", func(r audit.Record) bool {
			return explicit(r) && r.Action == "deny" && r.DstIP == w.gw.String()
		})
		w.waitAudit(t, sb.ID, "the proxy's DNS query", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.Proto == "proxy" && r.DstHost == "allowed.test" && r.Action == "allow"
		})
	}, func(c *Config) { c.ProxyPort = 3128 })
}

// TestEgressdExplicitProxyRefusesSandboxes: the explicit proxy dials from the host,
// where the sandbox network's isolation does not apply, so it refuses a sandbox's
// address as a destination even when the policy allows the sandbox subnet (here with
// an operator overlay that does not deny it).
func TestEgressdExplicitProxyRefusesSandboxes(t *testing.T) {
	w := newWorld(t)
	_, subnet, _ := w.h.Runtime.Network()
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, subnet.Masked().String())
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		d.mu.RLock()
		addr := d.byID[sb.ID].view.Address
		d.mu.RUnlock()
		_, got := sh(t, x, fmt.Sprintf("curl -sS -m 3 -x http://%s:3128 http://%s:%d/ping -w ' %%{http_code}'", w.gw, addr, opensandbox.ExecdPort))
		if !strings.Contains(got, "EGRESS_DENIED") || !strings.HasSuffix(got, " 403") {
			t.Errorf("a sandbox's execd through the proxy under a policy allowing %s: %q, want 403 EGRESS_DENIED", subnet, got)
		}
	}, func(c *Config) { c.ProxyPort = 3128 })
}

// TestEgressdReportMode: a policy in report mode lets through (and audits as would-deny)
// what it would deny, never what the operator overlay or the special-address guard deny.
func TestEgressdReportMode(t *testing.T) {
	w := newWorld(t)
	const policy = `{"mode":"report","defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if got := curl(t, x, "http://denied.test/"); got != "denied" {
			t.Errorf("a name the policy would deny, in report mode = %q", got)
		}
		if got := curl(t, x, "http://"+cidrIP.String()+":8080/"); got != "cidr" {
			t.Errorf("an address the policy would deny, in report mode = %q", got)
		}
		if got := curl(t, x, "http://169.254.169.254/"); got != "" {
			t.Errorf("cloud metadata (overlay) in report mode = %q", got)
		}
		if got := curl(t, x, fmt.Sprintf("http://%s:%d/", w.gw, w.hostPort)); got != "" {
			t.Errorf("the host (overlay) in report mode = %q", got)
		}
		w.waitAudit(t, sb.ID, "would-deny DNS", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.DstHost == "denied.test" && r.Action == "allow" && r.WouldDeny
		})
		w.waitAudit(t, sb.ID, "metadata drop", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.DstIP == "169.254.169.254" && r.Action == "deny" && !r.WouldDeny
		})
	})
}

// TestEgressdNamePorts: a name allowed on some ports makes its addresses reachable on
// those ports only, and a policy change that moves the ports applies at once to the
// address already learned (no new DNS answer needed).
func TestEgressdNamePorts(t *testing.T) {
	w := newWorld(t)
	policy := func(port int) string {
		return fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":"ported.test","ports":[%d],"protocols":["tcp"]}]}`, port)
	}
	w.eachBackend(t, policy(8080), func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if got := curl(t, x, "http://ported.test:8080/"); got != "cidr" {
			t.Errorf("the allowed port of the name = %q", got)
		}
		if got := curl(t, x, "http://ported.test:8081/"); got != "" {
			t.Errorf("another port of the allowed name's address = %q", got)
		}
		w.putPolicy(t, sb.ID, policy(8081))
		// --resolve: no DNS query, the address is reached through what was learned.
		pinned := func(port int) string {
			return fmt.Sprintf("--resolve ported.test:%d:%s http://ported.test:%d/", port, cidrIP, port)
		}
		deadline := time.Now().Add(10 * time.Second)
		for curl(t, x, pinned(8081)) != "cidr-8081" {
			if time.Now().After(deadline) {
				t.Fatal("the learned address is not reachable on the newly allowed port")
			}
		}
		if got := curl(t, x, pinned(8080)); got != "" {
			t.Errorf("the learned address on the formerly allowed port = %q", got)
		}
	})
}

// TestEgressdNarrowingKeepsAllowedFlows: a policy change that narrows a name's ports
// cuts the established flow on the port that became denied and leaves the one on the
// port that stays allowed working (one keep-alive HTTP connection each, used before and
// after the change).
func TestEgressdNarrowingKeepsAllowedFlows(t *testing.T) {
	w := newWorld(t)
	policy := func(ports string) string {
		return `{"defaultAction":"deny","egress":[{"action":"allow","target":"ported.test","ports":[` + ports + `],"protocols":["tcp"]}]}`
	}
	client := `import http.client,os,time
def get(c):
    try:
        c.request('GET','/');r=c.getresponse();r.read();return 'ok' if r.status==200 else 'status%d'%r.status
    except Exception as e:
        return 'fail'
a=http.client.HTTPConnection('ported.test',8080,timeout=3);b=http.client.HTTPConnection('ported.test',8081,timeout=3)
open('/tmp/before','w').write(get(a)+' '+get(b))
while not os.path.exists('/tmp/go'): time.sleep(0.05)
open('/tmp/after','w').write(get(a)+' '+get(b))`
	w.eachBackend(t, policy("8080,8081"), func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		if code, out := sh(t, x, "cat > /tmp/c.py <<'EOF'\n"+client+"\nEOF\nnohup python3 /tmp/c.py >/dev/null 2>&1 &"); code != 0 {
			t.Fatalf("starting the client: %d %s", code, out)
		}
		read := func(name string) string {
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if _, out := sh(t, x, "cat /tmp/"+name+" 2>/dev/null"); out != "" {
					return out
				}
				if time.Now().After(deadline) {
					t.Fatalf("the client wrote no /tmp/%s", name)
				}
			}
		}
		if got := read("before"); got != "ok ok" {
			t.Fatalf("before the change: %q, want ok ok", got)
		}
		w.putPolicy(t, sb.ID, policy("8080"))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			d.mu.RLock()
			v := d.byID[sb.ID].view.PolicyVersion
			d.mu.RUnlock()
			if v >= 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the narrowed policy was not applied")
			}
		}
		sh(t, x, "touch /tmp/go")
		if got := read("after"); got != "ok fail" {
			t.Errorf("after narrowing to 8080: %q, want ok fail (8080's flow kept, 8081's cut)", got)
		}
	})
}

// TestEgressdDualStack: on a dual-stack sandbox network the IPv6 side is enforced and
// audited like IPv4, on both backends: an IPv6 CIDR rule, a name with an AAAA answer,
// a denied IPv6 address refused at once and audited; the special-address guard covers
// the host's ULA, link-local and the IPv4-mapped form of a denied IPv4 address.
func TestEgressdDualStack(t *testing.T) {
	w := newWorld(t)
	policy := `{"defaultAction":"deny","egress":[
 {"action":"allow","target":"` + cidr6.String() + `"},
 {"action":"allow","target":"six.test"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		d.mu.RLock()
		addrs := d.byID[sb.ID].addrs
		d.mu.RUnlock()
		if len(addrs) != 2 || !addrs[1].Is6() || !subnet6.Contains(addrs[1]) {
			t.Fatalf("sandbox addresses %v, want an IPv4 and an IPv6 in %s", addrs, subnet6)
		}
		if got := curl(t, x, "-6 http://["+cidr6.String()+"]/"); got != "cidr6" {
			t.Errorf("IPv6 CIDR rule: %q, want cidr6", got)
		}
		if got := curl(t, x, "-6 http://six.test/"); got != "name6" {
			t.Errorf("name with an AAAA answer: %q, want name6", got)
		}
		want := refusal(enforcer.Mode(d.Backend()), "tcp")
		for _, c := range []struct {
			what string
			addr netip.Addr
		}{
			{"a denied IPv6 address", denied6},
			{"the host's ULA", w.gw6},
			{"link-local", netip.MustParseAddr("fe80::1").WithZone("eth0")},
			{"IPv4-mapped denied address", netip.AddrFrom16(deniedIP.As16())},
		} {
			if got := attempt(t, x, "tcp", c.addr, 80); got != want {
				t.Errorf("%s (%s): %s, want %s", c.what, c.addr, got, want)
			}
		}
		w.waitAudit(t, sb.ID, "IPv6 deny", func(r audit.Record) bool {
			return r.Source == audit.SourceBPF && r.Action == "deny" && r.DstIP == denied6.String()
		})
		w.waitAudit(t, sb.ID, "AAAA answer", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.QType == "AAAA" && r.DstHost == "six.test" && r.Action == "allow"
		})
	})
}

// TestEgressdBackendSwitch: egressd restarted with the other backend keeps managing
// the sandboxes the first one attached: they stay with the old backend (their open
// connections survive), which still receives their policy changes, until they are
// deleted, when the old backend keeps nothing of them; a new sandbox uses the
// configured backend.
func TestEgressdBackendSwitch(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct{ from, to enforcer.Mode }{
		{enforcer.ModeEBPF, enforcer.ModeNFTables},
		{enforcer.ModeNFTables, enforcer.ModeEBPF},
	} {
		t.Run(string(c.from)+" to "+string(c.to), func(t *testing.T) {
			pins := pinRoot(t)
			d1, stop1 := w.daemon(t, c.from, pins)
			old, x := w.create(t, d1, startPolicy)
			if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
				t.Fatalf("allowed.test = %q", got)
			}
			stop1()
			d2, _ := w.daemon(t, c.to, pins)
			waitAttached(t, d2, old.ID, true)
			if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
				t.Errorf("allowed.test after the switch = %q", got)
			}
			if got := curl(t, x, "http://"+deniedIP.String()+"/"); got != "" {
				t.Errorf("a denied address is reachable after the switch: %q", got)
			}
			// an unmanaged filter of the old backend would still drop denied.test (never
			// learned there) and keep allowed.test's address open
			w.changePolicy(t, old.ID, x)
			// a new sandbox uses the configured backend
			fresh, y := w.create(t, d2, startPolicy)
			if got := curl(t, y, "http://allowed.test/"); got != "allowed" {
				t.Errorf("allowed.test from a sandbox created after the switch = %q", got)
			}
			onNFT := len(w.leftovers(t, enforcer.ModeNFTables, pins, []string{fresh.ID})) > 0
			if onNFT != (c.to == enforcer.ModeNFTables) {
				t.Errorf("the sandbox created after the switch is on nftables: %v, want %v", onNFT, c.to == enforcer.ModeNFTables)
			}
			for _, sb := range []*sdk.Sandbox{old, fresh} {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				err := w.api.Kill(ctx, sb.ID)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				waitAttached(t, d2, sb.ID, false)
			}
			for _, mode := range []enforcer.Mode{c.from, c.to} {
				if left := w.leftovers(t, mode, pins, []string{old.ID, fresh.ID}); len(left) != 0 {
					t.Errorf("%s left behind after the deletes: %v", mode, left)
				}
			}
		})
	}
}
