package dnsfilter

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/audit"
)

// The sandboxes of the guard tests: Resolve queries as if sent from their addresses.
var (
	sandboxA = netip.MustParseAddr("127.0.0.1")
	sandboxB = netip.MustParseAddr("127.0.0.2")
)

// startTwoSandboxes starts the filter with the test policy (or doc) for two sandboxes,
// sb-test at 127.0.0.1 and sb-other at 127.0.0.2, and the default configuration.
func startTwoSandboxes(t *testing.T, doc string) *harness {
	t.Helper()
	var h *harness
	h = startFilter(t, doc, func(c *Config) {
		c.Lookup = func(src netip.Addr) (Sandbox, bool) {
			switch src {
			case sandboxA:
				return Sandbox{ID: "sb-test", Policy: h.policy.Load()}, true
			case sandboxB:
				return Sandbox{ID: "sb-other", Policy: h.policy.Load()}, true
			}
			return Sandbox{}, false
		}
	})
	return h
}

func resolve(t *testing.T, h *harness, src netip.Addr, name string) int {
	t.Helper()
	r, err := h.srv.Resolve(src, name, dns.TypeA)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", name, err)
	}
	return r.Rcode
}

// TestGuardRefusesHexLabel: a label of 60 hex digits (30 bytes of data, as DNS tunnels
// encode it; its Shannon entropy is under 4 bits per character) is refused before it
// reaches an upstream, under an allowed domain and with the default configuration.
func TestGuardRefusesHexLabel(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	label := "4f6e6365207570706e206120746d6520696e2061206c616e642066617220"
	if len(label) != 60 {
		t.Fatalf("label of %d characters", len(label))
	}
	name := label + ".t.example.com"
	r := h.ask(t, "udp", name, dns.TypeA, 1232)
	if r.Rcode != dns.RcodeRefused {
		t.Fatalf("60 hex digits: %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	if ede := findEDE(r); ede == nil || ede.InfoCode != dns.ExtendedErrorCodeProhibited {
		t.Errorf("no Prohibited EDE: %v", r.Extra)
	}
	if n := h.up.total(name); n != 0 {
		t.Errorf("upstream saw the tunnelled name %d times", n)
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == name })
	if rec.Action != "deny" || rec.Rule != "dns.tunnelGuard" || !strings.Contains(rec.Reason, "tunnelling") {
		t.Errorf("audit = %+v", rec)
	}
	// 40 hex digits pass alone, not three of them in one name
	hex40 := label[:40]
	if r := h.ask(t, "udp", hex40+".t.example.com", dns.TypeA, 0); r.Rcode == dns.RcodeRefused {
		t.Errorf("one label of 40 hex digits refused")
	}
	if r := h.ask(t, "udp", hex40+"."+label[20:60]+"."+label[10:50]+".t.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeRefused {
		t.Errorf("three labels of 40 hex digits: %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	// The same data in base64url and in base32 is refused as well.
	for _, l := range []string{"T25jZSB1cG9uIGEgdGltZSBpbiBhIGxhbmQgZmFyIGF3YXksIGEgZHJhZ29u", "j5xgg2jaovyg63ramuqhi2lnmuqgs3rameqgyylom4qgmylsebqxo"} {
		if r := h.ask(t, "udp", l+".t.example.com", dns.TypeA, 0); r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: %s, want REFUSED", l, dns.RcodeToString[r.Rcode])
		}
	}
}

// TestGuardOrdinaryNamesPass: names real workloads use, CDN and cloud names with
// random-looking labels included, pass the default guard.
func TestGuardOrdinaryNamesPass(t *testing.T) {
	h := startFilter(t, "defaultAction: allow\n", nil)
	for _, name := range []string{
		"files.pythonhosted.org", "pypi.org", "registry-1.docker.io", "production.cloudflare.docker.com",
		"registry.npmjs.org", "proxy.golang.org", "deb.debian.org", "objects.githubusercontent.com",
		"d3c33hcgiwev3.cloudfront.net", "prod-registry-k8s-io-us-east-1.s3.dualstack.us-east-1.amazonaws.com",
		"pub-3626123a908346a7a8be8d9295f44e26.r2.dev", // 32 hex digits: a Cloudflare R2 bucket
		"A1B2C3D4E5F6A7B8C9D0E1F2A3B4C5D6.gr7.us-west-2.eks.amazonaws.com",
		"3f2504e0-4f89-11d3-9a0c-0305e82c3301.ods.opinsights.azure.com", // a UUID
		"e3b0c44298fc1c149afbf4c8996fb924.cdn.example.com",
		"r4---sn-4g5e6nsz.googlevideo.com", "123456789012.dkr.ecr.us-east-1.amazonaws.com",
		"my-long-service-name-for-the-production-environment-eu-west.example.com",
		"xn--80aaxitdbjk.xn--p1ai", "myaks-dns-a1b2c3d4.3c6a8f1e-0d8f-4b3a-9c2b-0123456789ab.privatelink.eastus.azmk8s.io",
	} {
		if rc := resolve(t, h, sandboxA, name); rc == dns.RcodeRefused {
			rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == strings.ToLower(name) })
			t.Errorf("%s refused: %s", name, rec.Reason)
		}
	}
}

// TestGuardDistinctNamesPerDomain: with the default configuration a sandbox gets 100
// distinct names under one registrable domain per minute, at any depth; the next is
// REFUSED and audited, while names it already asked, names under another domain and
// the same names asked by another sandbox are answered.
func TestGuardDistinctNamesPerDomain(t *testing.T) {
	h := startTwoSandboxes(t, testPolicy)
	for i := range 100 {
		name := fmt.Sprintf("n%d.example.com", i)
		if i%2 == 1 {
			name = fmt.Sprintf("n%d.deep.example.com", i)
		}
		if rc := resolve(t, h, sandboxA, name); rc == dns.RcodeRefused {
			t.Fatalf("name %d (%s) refused", i, name)
		}
	}
	if rc := resolve(t, h, sandboxA, "n100.example.com"); rc != dns.RcodeRefused {
		t.Fatalf("101st name under example.com: %s, want REFUSED", dns.RcodeToString[rc])
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "n100.example.com" })
	if rec.Action != "deny" || rec.Rule != "dns.tunnelGuard" || rec.SandboxID != "sb-test" ||
		!strings.Contains(rec.Reason, "example.com") || !strings.Contains(rec.Reason, "100") {
		t.Errorf("audit = %+v", rec)
	}
	if n := h.up.total("n100.example.com"); n != 0 {
		t.Errorf("the refused name reached the upstream %d times", n)
	}
	if rc := resolve(t, h, sandboxA, "n0.example.com"); rc == dns.RcodeRefused {
		t.Error("a name already asked this minute was refused")
	}
	if rc := resolve(t, h, sandboxA, "edge.cdn.example.net"); rc == dns.RcodeRefused {
		t.Error("a name under another registrable domain was refused")
	}
	for i := range 100 {
		if rc := resolve(t, h, sandboxB, fmt.Sprintf("n%d.example.com", i)); rc == dns.RcodeRefused {
			t.Fatalf("another sandbox refused at its name %d", i)
		}
	}
	// denied names never reach an upstream and do not count: 250 of them and then 100
	// allowed ones stay under the sandbox's 300
	for i := range 250 {
		if rc := resolve(t, h, sandboxB, fmt.Sprintf("n%d.example.org", i)); rc != dns.RcodeNameError {
			t.Fatalf("denied name %d: %s, want NXDOMAIN", i, dns.RcodeToString[rc])
		}
	}
	for i := range 100 {
		if rc := resolve(t, h, sandboxB, fmt.Sprintf("x.d%d.bench", i)); rc == dns.RcodeRefused {
			t.Fatalf("allowed name %d after denied ones refused", i)
		}
	}
}

// TestGuardDistinctNamesPerRule: names that one wildcard rule allows count together
// even when each is its own registrable domain (names under an unlisted top-level
// domain, like a.one.bench, are); 200 a minute by default.
func TestGuardDistinctNamesPerRule(t *testing.T) {
	h := startTwoSandboxes(t, testPolicy)
	for i := range 200 {
		if rc := resolve(t, h, sandboxA, fmt.Sprintf("x.d%d.bench", i)); rc == dns.RcodeRefused {
			t.Fatalf("name %d refused", i)
		}
	}
	if rc := resolve(t, h, sandboxA, "x.d200.bench"); rc != dns.RcodeRefused {
		t.Fatalf("201st name of rule *.bench: %s, want REFUSED", dns.RcodeToString[rc])
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "x.d200.bench" })
	if rec.Rule != "dns.tunnelGuard" || !strings.Contains(rec.Reason, "egress[2]") {
		t.Errorf("audit = %+v", rec)
	}
	if rc := resolve(t, h, sandboxA, "allowed.example.com"); rc != dns.RcodeSuccess {
		t.Errorf("a name of another rule: %s", dns.RcodeToString[rc])
	}
	if rc := resolve(t, h, sandboxB, "x.d200.bench"); rc == dns.RcodeRefused {
		t.Error("another sandbox refused")
	}
}

// TestGuardDistinctNamesPerSandbox: 300 distinct names a minute per sandbox by default,
// however they spread over domains and rules.
func TestGuardDistinctNamesPerSandbox(t *testing.T) {
	h := startTwoSandboxes(t, testPolicy)
	n := 0
	for _, pattern := range []string{"n%d.example.com", "n%d.cdn.example.net", "x.d%d.bench"} {
		for i := range 100 {
			if rc := resolve(t, h, sandboxA, fmt.Sprintf(pattern, i)); rc == dns.RcodeRefused {
				t.Fatalf("name %d (%s) refused", n, fmt.Sprintf(pattern, i))
			}
			n++
		}
	}
	if rc := resolve(t, h, sandboxA, "x.d100.bench"); rc != dns.RcodeRefused {
		t.Fatalf("301st name: %s, want REFUSED", dns.RcodeToString[rc])
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "x.d100.bench" })
	if rec.Rule != "dns.tunnelGuard" || !strings.Contains(rec.Reason, "300") {
		t.Errorf("audit = %+v", rec)
	}
	if rc := resolve(t, h, sandboxB, "x.d100.bench"); rc == dns.RcodeRefused {
		t.Error("another sandbox refused")
	}
}

// TestGuardReportMode: in report mode a name over a cap is answered and audited
// would_deny.
func TestGuardReportMode(t *testing.T) {
	h := startTwoSandboxes(t, "mode: report\n"+testPolicy)
	for i := range 101 {
		resolve(t, h, sandboxA, fmt.Sprintf("n%d.example.com", i))
	}
	rec := findRecord(t, h.rec.all(), func(r audit.Record) bool { return r.DstHost == "n100.example.com" })
	if rec.Action != "allow" || !rec.WouldDeny || !strings.Contains(rec.Reason, "example.com") {
		t.Errorf("audit = %+v", rec)
	}
	hex := "4f6e6365207570706e206120746d6520696e2061206c616e642066617220.t.example.com"
	if r, _ := h.srv.Resolve(sandboxB, hex, dns.TypeA); r.Rcode == dns.RcodeRefused {
		t.Error("report mode refused a high-scoring label")
	}
}
