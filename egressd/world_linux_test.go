package egressd

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/sdk"
)

func TestMain(m *testing.M) {
	if arg := os.Getenv(deadHelperEnv); arg != "" {
		os.Exit(deadEgressdHelper(arg))
	}
	lctest.Network = "altest-eg0"
	lctest.RemoveNetwork(lctest.Network) // a leftover may lack IPv6
	code := m.Run()
	lctest.RemoveNetwork(lctest.Network)
	os.Exit(code)
}

// The "internet" the sandboxes try to reach: a network namespace routed from the host
// (documentation prefixes, which policies classify as public), with these servers.
var (
	allowedIP = netip.MustParseAddr("203.0.113.10")  // allowed.test
	deniedIP  = netip.MustParseAddr("203.0.113.20")  // denied.test
	cidrIP    = netip.MustParseAddr("198.51.100.10") // reached by a CIDR rule; also a rogue resolver
	// IPv6 (2001:db8::/32, documentation) for dual-stack sandboxes.
	cidr6   = netip.MustParseAddr("2001:db8:a1e::10") // reached by a CIDR rule
	denied6 = netip.MustParseAddr("2001:db8:a1e::20") // denied
	name6   = netip.MustParseAddr("2001:db8:a1e::30") // six.test (AAAA)
	// subnet6 is the sandbox network's IPv6 (a ULA /64).
	subnet6 = netip.MustParsePrefix("fd00:a1e:6::/64")
)

// world is everything one egressd test run needs: a lifecycle server on a real Docker
// engine whose sandboxes resolve through the bridge gateway, the internet namespace,
// a fake upstream resolver on loopback and an audit log.
type world struct {
	h        *lctest.Harness
	gw, gw6  netip.Addr // the bridge gateway (the host on the sandbox network)
	upstream string
	auditDir string
	audit    *audit.Writer
	hostPort int    // a TCP listener on the bridge gateway address (the host)
	nftTable string // the world's nftables tables (other packages' tests run egressd at once)
	api      *sdk.Client
	current  atomic.Pointer[Daemon] // the daemon the ready gate asks
	// gvisor: the sandboxes run under gVisor's runsc (lctest.Options.OCIRuntime).
	gvisor bool
	// ns is the internet namespace (more servers can be added there).
	ns datapathtest.Netns
}

// newWorld builds the world; opts adjust the lifecycle harness (pools, aliases).
func newWorld(t *testing.T, opts ...func(*lctest.Options)) *world {
	testenv.NeedRoot(t)
	testenv.NeedBPF(t)
	w := &world{nftTable: nfttest.Table(t)}
	// Like airlock up: a sandbox's entrypoint is released only once the egressd under
	// test enforces its policy.
	gate := func(id string) bool {
		d := w.current.Load()
		return d != nil && d.Enforced(id)
	}
	policyGate := func(id string, version uint64) bool {
		d := w.current.Load()
		if d == nil {
			return false
		}
		v, ok := d.EnforcedVersion(id)
		return ok && v >= version
	}
	o := lctest.Options{DNSOnGateway: true, ReadyGate: gate, PolicyGate: policyGate, Subnet6: subnet6}
	for _, f := range opts {
		f(&o)
	}
	w.gvisor = cmp.Or(o.OCIRuntime, os.Getenv("AIRLOCK_TEST_DOCKER_RUNTIME")) == "runsc"
	h := lctest.New(t, o)
	_, _, gw := h.Runtime.Network()
	w.h, w.gw = h, gw
	if _, w.gw6 = h.Runtime.Network6(); !w.gw6.IsValid() {
		t.Fatalf("the sandbox network %s has no IPv6", lctest.Network)
	}
	w.internet(t)
	w.upstream = fakeUpstream(t)
	w.auditDir = t.TempDir()
	aw, err := audit.New(audit.Config{Dir: w.auditDir, SyncInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { aw.Close() })
	w.audit = aw
	l, err := net.Listen("tcp", netip.AddrPortFrom(gw, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go http.Serve(l, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, "host") }))
	w.hostPort = l.Addr().(*net.TCPAddr).Port
	if w.api, err = sdk.New(sdk.Config{BaseURL: h.HTTP.URL}); err != nil {
		t.Fatal(err)
	}
	return w
}

// internet creates the namespace, a veth to it from the host, routes for the two
// documentation prefixes through it, and the servers.
func (w *world) internet(t *testing.T) {
	ns := datapathtest.NewNetns(t, "aleg")
	w.ns = ns
	host, peer := "alegh0", "alegn0"
	exec.Command("ip", "link", "del", host).Run() // a leftover from a killed run
	datapathtest.IP(t, "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns.Name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	datapathtest.IP(t, "addr", "add", "10.251.0.1/30", "dev", host)
	datapathtest.IP(t, "link", "set", host, "up")
	datapathtest.IP(t, "-n", ns.Name, "addr", "add", "10.251.0.2/30", "dev", peer)
	datapathtest.IP(t, "-n", ns.Name, "link", "set", peer, "up")
	for _, a := range []netip.Addr{allowedIP, deniedIP, cidrIP} {
		datapathtest.IP(t, "-n", ns.Name, "addr", "add", a.String()+"/32", "dev", "lo")
	}
	datapathtest.IP(t, "-n", ns.Name, "route", "add", "default", "via", "10.251.0.1")
	datapathtest.IP(t, "route", "replace", "203.0.113.0/24", "via", "10.251.0.2")
	datapathtest.IP(t, "route", "replace", "198.51.100.0/24", "via", "10.251.0.2")
	// IPv6: the host routes 2001:db8:a1e::/48 to the namespace (forwarding on, as
	// Docker has it for an IPv6 network).
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	datapathtest.IP(t, "-6", "addr", "add", "fd00:251::1/64", "dev", host, "nodad")
	datapathtest.IP(t, "-n", ns.Name, "-6", "addr", "add", "fd00:251::2/64", "dev", peer, "nodad")
	for _, a := range []netip.Addr{cidr6, denied6, name6} {
		// nodad: bindable at once (a tentative address refuses bind with EADDRNOTAVAIL).
		datapathtest.IP(t, "-n", ns.Name, "-6", "addr", "add", a.String()+"/128", "dev", "lo", "nodad")
	}
	datapathtest.IP(t, "-n", ns.Name, "-6", "route", "add", "default", "via", "fd00:251::1")
	datapathtest.IP(t, "-6", "route", "replace", "2001:db8:a1e::/48", "via", "fd00:251::2")
	serve := func(addr, body string) {
		l, err := ns.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen %s: %v", addr, err)
		}
		t.Cleanup(func() { l.Close() })
		go http.Serve(l, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, body) }))
	}
	tlsL, err := ns.Listen("tcp", allowedIP.String()+":443")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, "allowed-tls") }))
	ts.Listener = tlsL
	ts.StartTLS()
	t.Cleanup(ts.Close)
	// The allowed name's address stands for a CDN address that hosts other sites too:
	// TLS on another port (8443) and a UDP echo on 443 (HTTP/3 would go there) must
	// stay out of reach of a sandbox whose L7 check is on (TestEgressdL7).
	tls8443, err := ns.Listen("tcp", allowedIP.String()+":8443")
	if err != nil {
		t.Fatal(err)
	}
	ts8443 := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, "allowed-8443") }))
	ts8443.Listener = tls8443
	ts8443.StartTLS()
	t.Cleanup(ts8443.Close)
	quic, err := ns.ListenPacket("udp", allowedIP.String()+":443")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { quic.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := quic.ReadFrom(buf)
			if err != nil {
				return
			}
			quic.WriteTo(buf[:n], from)
		}
	}()
	serve(allowedIP.String()+":80", "allowed")
	serve(deniedIP.String()+":80", "denied")
	serve(cidrIP.String()+":8080", "cidr")
	serve(cidrIP.String()+":8081", "cidr-8081")
	serve(cidrIP.String()+":853", "dot")
	serve(cidrIP.String()+":53", "tcp-dns")
	serve("["+cidr6.String()+"]:80", "cidr6")
	serve("["+denied6.String()+"]:80", "denied6")
	serve("["+name6.String()+"]:80", "name6")
	// A rogue resolver that answers everything: reaching it would bypass the filter.
	pc, err := ns.ListenPacket("udp", cidrIP.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go dns.ActivateAndServe(nil, pc, dns.HandlerFunc(answerAll(deniedIP)))
}

// fakeUpstream starts the upstream resolver egressd forwards to, on loopback.
func fakeUpstream(t *testing.T) string {
	return dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{
		"allowed.test.": allowedIP, "denied.test.": deniedIP, "other.test.": deniedIP,
		"rebind.test.": netip.MustParseAddr("10.0.0.1"), "ported.test.": cidrIP,
		"six.test.": name6,
	}, 300))
}

func answerAll(a netip.Addr) func(dns.ResponseWriter, *dns.Msg) {
	return func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA,
			Class: dns.ClassINET, Ttl: 300}, A: a.AsSlice()})
		rw.WriteMsg(m)
	}
}

// daemon starts egressd on the world with the given backend and pin root.
func (w *world) daemon(t *testing.T, mode enforcer.Mode, pinRoot string, opts ...func(*Config)) (*Daemon, func()) {
	t.Helper()
	ov := policies.BaseOverlay()
	ov.DenyAddrs(w.gw, w.gw6)
	cfg := Config{
		Watch:     watch.ClientConfig{URL: w.h.HTTP.URL + "/internal/v1/watch"},
		Enforcer:  enforcer.Config{Mode: mode, EBPF: EBPFBackend(pinRoot), NFT: nftfilter.Config{Table: w.nftTable}},
		DNSListen: netip.AddrPortFrom(w.gw, 53).String(),
		Upstreams: []string{w.upstream},
		Overlay:   ov,
		Audit:     w.audit,
		Registry:  prometheus.NewRegistry(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Backend(); string(got) != string(mode) {
		d.Close()
		t.Fatalf("backend = %s, want %s", got, mode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w.current.Store(d)
	go func() { defer close(done); d.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return d, stop
}

// create makes a sandbox with policy ("": none) and entrypoint (none: the SDK's
// default), waits until d enforces it, then until it is Running. Waiting for enforcement first keeps every connection the test opens
// to the sandbox younger than its filter (the nftables backend recognises replies to
// inbound connections by the SYN-ACK it saw, see egressd/nftfilter/README.md).
func (w *world) create(t *testing.T, d *Daemon, policy string, entrypoint ...string) (*sdk.Sandbox, *sdk.Execd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := sdk.CreateRequest{Image: w.h.Image, Timeout: 10 * time.Minute, Entrypoint: entrypoint}
	if policy != "" {
		req.NetworkPolicy = json.RawMessage(policy)
	}
	sb, err := w.api.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	waitAttached(t, d, sb.ID, true)
	if _, err := w.api.WaitState(ctx, sb.ID, "Running", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	x, err := w.api.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return sb, x
}

// eachBackend runs fn once per datapath backend, with a fresh egressd (opts) and a
// sandbox created with policy ("": none) that is killed when fn returns.
func (w *world) eachBackend(t *testing.T, policy string, fn func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd), opts ...func(*Config)) {
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			d, _ := w.daemon(t, mode, pinRoot(t), opts...)
			sb, x := w.create(t, d, policy)
			defer w.api.Kill(context.Background(), sb.ID)
			fn(t, d, sb, x)
		})
	}
}

// sh runs a shell command in the sandbox and returns its exit code and stdout.
func sh(t *testing.T, x *sdk.Execd, cmd string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ex, err := x.Run(ctx, sdk.Command{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return ex.ExitCode(), strings.TrimSpace(strings.Join(ex.Stdout, "\n"))
}

// attempt tries one connection from the sandbox (TCP connect, or a connected UDP
// socket's send and receive) and names the outcome: "eperm" (refused at the socket),
// "reset" (ECONNREFUSED), "unreachable" (EHOSTUNREACH: ICMP administratively
// prohibited), "timeout" (3 s) or "ok".
func attempt(t *testing.T, x *sdk.Execd, proto string, host netip.Addr, port int) string {
	t.Helper()
	py := `import socket,errno
t=socket.SOCK_STREAM if '%s'=='tcp' else socket.SOCK_DGRAM
s=socket.socket(socket.AF_INET6 if ':' in '%s' else socket.AF_INET,t);s.settimeout(3)
try:
    h,p='%s',%d
    s.connect((h.split('%%')[0],p,0,socket.if_nametoindex(h.split('%%')[1])) if '%%' in h else (h,p))
    if t==socket.SOCK_DGRAM:
        s.send(b'x');s.recv(512)
    print('ok')
except socket.timeout:
    print('timeout')
except OSError as e:
    print({errno.EPERM:'eperm',errno.ECONNREFUSED:'reset',errno.EHOSTUNREACH:'unreachable'}.get(e.errno,'errno%%d'%%e.errno))`
	_, out := sh(t, x, "python3 -c \""+fmt.Sprintf(py, proto, host, host, port)+"\"")
	return out
}

// refusal is what a denied attempt meets on each backend: EPERM from the socket layer
// (eBPF), a TCP reset or ICMP administratively prohibited (nftables).
func refusal(mode enforcer.Mode, proto string) string {
	switch {
	case mode == enforcer.ModeEBPF:
		return "eperm"
	case proto == "tcp":
		return "reset"
	}
	return "unreachable"
}

// putPolicy replaces sandbox id's policy through the lifecycle API (200 expected).
func (w *world) putPolicy(t *testing.T, id, doc string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, w.h.HTTP.URL+"/v1/sandboxes/"+id+"/policy", strings.NewReader(doc))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Body.Close(); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /policy: %d", resp.StatusCode)
	}
}

// curl fetches url from the sandbox; it returns the body, or "" when the request failed.
func curl(t *testing.T, x *sdk.Execd, url string) string {
	t.Helper()
	code, out := sh(t, x, "curl -sS -m 3 "+url)
	if code != 0 {
		return ""
	}
	return out
}

// waitAttached waits until the datapath enforces id (want true) or no longer does.
func waitAttached(t *testing.T, d *Daemon, id string, want bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := false
		for _, a := range d.Datapath().Attached() {
			got = got || a == id
		}
		d.mu.RLock()
		sb := d.byID[id]
		inDir := sb != nil && sb.attached
		d.mu.RUnlock()
		if got == want && inDir == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s attached=%v (directory %v), want %v", id, got, inDir, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitAudit waits for an audit record of sandbox id matching pred.
func (w *world) waitAudit(t *testing.T, id, what string, pred func(audit.Record) bool) audit.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, _, err := audit.Query(w.auditDir, audit.Filter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if pred(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record for %s (%d records of %s)", what, len(recs), id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// EBPFBackend returns the eBPF backend pinned under pinRoot. backend_linux_test.go
// (package egressd_test) sets it from internal/ebpftest: no package under egressd/
// imports ebpf/, test packages included, so the tests here see only enforcer.EBPF.
var EBPFBackend func(pinRoot string) enforcer.EBPF

func pinRoot(t *testing.T) string {
	var b [4]byte
	rand.Read(b[:])
	p := filepath.Join("/sys/fs/bpf", "airlock-egtest-"+hex.EncodeToString(b[:]))
	t.Cleanup(func() { os.RemoveAll(p) })
	return p
}

// noOwnTrafficDenied fails when the audit log holds a bpf deny record of Airlock's own
// traffic: a packet from a sandbox's execd port (replies to lifecycle's readiness
// probe and release, and to the test's commands).
func (w *world) noOwnTrafficDenied(t *testing.T) {
	t.Helper()
	recs, _, err := audit.Query(w.auditDir, audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Source == audit.SourceBPF && r.Action == "deny" && strings.HasSuffix(r.Src, ":"+strconv.Itoa(opensandbox.ExecdPort)) {
			t.Errorf("Airlock's own traffic denied: %+v", r)
		}
	}
}
