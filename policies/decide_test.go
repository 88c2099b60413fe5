package policies

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func compile(t *testing.T, doc string, ov *Overlay) *Decider {
	t.Helper()
	d, err := Load("test.yaml", []byte(doc), CompileOptions{Overlay: ov, Version: 3})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type decideCase struct {
	name      string
	target    string
	port      uint16
	proto     Protocol
	action    Action
	rule      string
	wouldDeny bool
}

func runCases(t *testing.T, d *Decider, cases []decideCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := d.Decide(c.target, c.port, c.proto)
			if got.Action != c.action || got.Rule != c.rule || got.WouldDeny != c.wouldDeny {
				t.Errorf("Decide(%s, %d, %q) = %s rule=%s would_deny=%t (%s); want %s rule=%s would_deny=%t",
					c.target, c.port, c.proto, got.Action, got.Rule, got.WouldDeny, got.Reason, c.action, c.rule, c.wouldDeny)
			}
			if got.Version != 3 {
				t.Errorf("version = %d", got.Version)
			}
		})
	}
}

func TestDecideWildcardsAndApex(t *testing.T) {
	d := compile(t, `
egress:
  - {action: allow, target: "*.example.com"}
  - {action: allow, target: exact.org}
`, nil)
	runCases(t, d, []decideCase{
		{"sub", "a.example.com", 443, TCP, Allow, "egress[0]", false},
		{"deep-sub", "a.b.c.example.com", 443, TCP, Allow, "egress[0]", false},
		{"apex-not-matched", "example.com", 443, TCP, Deny, "default", false},
		{"suffix-lookalike", "badexample.com", 443, TCP, Deny, "default", false},
		{"case-and-dot", "A.EXAMPLE.COM.", 443, TCP, Allow, "egress[0]", false},
		{"exact", "exact.org", 80, TCP, Allow, "egress[1]", false},
		{"exact-no-subdomains", "www.exact.org", 80, TCP, Deny, "default", false},
		{"any-port", "x.example.com", 0, "", Allow, "egress[0]", false},
	})
}

func TestDecideFirstMatchOrder(t *testing.T) {
	d := compile(t, `
defaultAction: allow
egress:
  - {action: deny, target: "*.github.com"}
  - {action: allow, target: api.github.com}
  - {action: allow, target: "*.pypi.org"}
  - {action: deny, target: files.pypi.org}
  - {action: deny, target: "*"}
`, nil)
	runCases(t, d, []decideCase{
		{"wildcard-before-exact-deny", "api.github.com", 443, TCP, Deny, "egress[0]", false},
		{"exact-after-wildcard-shadowed", "files.pypi.org", 443, TCP, Allow, "egress[2]", false},
		{"catch-all-last", "other.net", 443, TCP, Deny, "egress[4]", false},
		{"catch-all-covers-public-ip", "198.51.100.1", 443, TCP, Deny, "egress[4]", false},
		{"apex-falls-to-catch-all", "github.com", 443, TCP, Deny, "egress[4]", false},
	})
}

func TestDecideCIDR(t *testing.T) {
	d := compile(t, `
egress:
  - {action: deny, target: 198.51.100.128/25}
  - {action: allow, target: 198.51.100.0/24}
  - {action: allow, target: 203.0.113.9}
  - {action: allow, target: "2001:db8::/32"}
  - {action: deny, target: "2001:db8:bad::/48"}
  - {action: allow, target: 10.1.0.0/16}
`, nil)
	runCases(t, d, []decideCase{
		{"v4-more-specific-first", "198.51.100.200", 443, TCP, Deny, "egress[0]", false},
		{"v4-broader", "198.51.100.5", 443, TCP, Allow, "egress[1]", false},
		{"v4-single", "203.0.113.9", 22, TCP, Allow, "egress[2]", false},
		{"v4-single-neighbour", "203.0.113.10", 22, TCP, Deny, "default", false},
		{"v6-broader-first", "2001:db8:bad::1", 443, TCP, Allow, "egress[3]", false},
		{"v6-outside", "2001:db9::1", 443, TCP, Deny, "default", false},
		{"private-explicit", "10.1.2.3", 443, TCP, Allow, "egress[5]", false},
		{"private-implicit", "10.2.0.1", 443, TCP, Deny, "guard", false},
		{"mapped-not-v4-rule", "::ffff:198.51.100.5", 443, TCP, Deny, "guard", false},
	})
	if !d.HasIPv6() {
		t.Error("HasIPv6 = false")
	}
	if n := len(d.IPRules()); n != 6 {
		t.Errorf("IPRules = %d, want 6", n)
	}
}

func TestDecidePortsAndProtocols(t *testing.T) {
	d := compile(t, `
egress:
  - {action: deny, target: example.com, ports: [22]}
  - {action: allow, target: example.com, ports: [443, "8000-8100"], protocols: [tcp]}
  - {action: allow, target: example.com, ports: [53], protocols: [udp]}
`, nil)
	runCases(t, d, []decideCase{
		{"denied-port", "example.com", 22, TCP, Deny, "egress[0]", false},
		{"allowed-port", "example.com", 443, TCP, Allow, "egress[1]", false},
		{"range", "example.com", 8050, TCP, Allow, "egress[1]", false},
		{"wrong-proto", "example.com", 443, UDP, Deny, "default", false},
		{"udp-port", "example.com", 53, UDP, Allow, "egress[2]", false},
		{"other-port", "example.com", 80, TCP, Deny, "default", false},
		{"any-port-resolves", "example.com", 0, "", Allow, "egress[1]", false},
	})
	got := d.DecideName("example.com", 0, "")
	if want := "tcp:443,8000-8100 udp:53"; got.Ports.String() != want {
		t.Errorf("Ports = %s, want %s", got.Ports, want)
	}
}

func TestDecideOverlayPrecedence(t *testing.T) {
	ov := BaseOverlay()
	if err := ov.Deny("control.airlock.internal", "192.0.2.10"); err != nil {
		t.Fatal(err)
	}
	if err := ov.Allow("mirror.corp.example", "169.254.1.1"); err != nil {
		t.Fatal(err)
	}
	d := compile(t, `
defaultAction: allow
egress:
  - {action: allow, target: 169.254.169.254}
  - {action: allow, target: control.airlock.internal}
  - {action: deny, target: mirror.corp.example}
  - {action: allow, target: 127.0.0.1}
`, ov)
	runCases(t, d, []decideCase{
		{"metadata-beats-sandbox-allow", "169.254.169.254", 80, TCP, Deny, "overlay.alwaysDeny[0]", false},
		{"metadata-v6", "fd00:ec2::254", 80, TCP, Deny, "overlay.alwaysDeny[1]", false},
		{"control-plane", "control.airlock.internal", 443, TCP, Deny, "overlay.alwaysDeny[21]", false},
		{"host-addr", "192.0.2.10", 443, TCP, Deny, "overlay.alwaysDeny[22]", false},
		{"loopback", "127.0.0.1", 443, TCP, Deny, "overlay.alwaysDeny[5]", false},
		{"always-allow-beats-sandbox-deny", "mirror.corp.example", 443, TCP, Allow, "overlay.alwaysAllow[0]", false},
		{"deny-beats-allow-in-overlay", "169.254.1.1", 443, TCP, Deny, "overlay.alwaysDeny[3]", false},
		{"localhost-name", "LOCALHOST", 80, TCP, Deny, "overlay.alwaysDeny[9]", false},
		{"public-default", "example.net", 443, TCP, Allow, "default", false},
	})
}

func TestDecideReportMode(t *testing.T) {
	d := compile(t, `
mode: report
egress:
  - {action: allow, target: pypi.org}
  - {action: deny, target: "*.evil.example"}
`, BaseOverlay())
	runCases(t, d, []decideCase{
		{"allowed", "pypi.org", 443, TCP, Allow, "egress[0]", false},
		{"rule-deny-reported", "x.evil.example", 443, TCP, Allow, "egress[1]", true},
		{"default-deny-reported", "other.example", 443, TCP, Allow, "default", true},
		{"any-port-reported", "other.example", 0, "", Allow, "default", true},
		{"overlay-still-enforced", "169.254.169.254", 80, TCP, Deny, "overlay.alwaysDeny[0]", false},
		{"guard-still-enforced", "10.0.0.1", 80, TCP, Deny, "guard", false},
	})
}

func TestDecideLearned(t *testing.T) {
	d := compile(t, `
egress:
  - {action: allow, target: "*.example.com"}
  - {action: allow, target: 10.5.0.0/16}
  - {action: deny, target: 198.51.100.66}
  - {action: allow, target: "*"}
`, BaseOverlay())
	cases := []struct {
		addr   string
		action Action
		rule   string
	}{
		{"198.51.100.7", Allow, "learned"},
		{"2001:db8::7", Allow, "learned"},
		{"127.0.0.1", Deny, "overlay.alwaysDeny[5]"},
		{"10.0.0.5", Deny, "guard"},
		{"10.5.1.1", Allow, "egress[1]"},
		{"192.168.1.1", Deny, "guard"},
		{"172.16.0.1", Deny, "guard"},
		{"100.64.0.1", Deny, "guard"},
		{"169.254.169.254", Deny, "overlay.alwaysDeny[0]"},
		{"::ffff:10.5.1.1", Deny, "guard"},
		{"fc00::1", Deny, "guard"},
		{"64:ff9b::a00:1", Deny, "guard"},
		{"198.51.100.66", Deny, "egress[2]"},
	}
	for _, c := range cases {
		got := d.DecideLearned("www.example.com", netip.MustParseAddr(c.addr), 0, "")
		if got.Action != c.action || got.Rule != c.rule {
			t.Errorf("DecideLearned(%s) = %s %s (%s); want %s %s", c.addr, got.Action, got.Rule, got.Reason, c.action, c.rule)
		}
	}
}

func TestExplainListsShadowedRules(t *testing.T) {
	d := compile(t, `
egress:
  - {action: deny, target: "*.github.com", comment: no github}
  - {action: allow, target: api.github.com}
`, BaseOverlay())
	dec, matches := d.Explain("api.github.com", 443, TCP)
	if dec.Rule != "egress[0]" || len(matches) != 2 || matches[1].Rule != "egress[1]" || matches[0].Comment != "no github" {
		t.Fatalf("Explain = %+v %+v", dec, matches)
	}
	if !strings.Contains(dec.Reason, "test.yaml:3") {
		t.Errorf("reason %q lacks the rule's location", dec.Reason)
	}
}

func TestDNSSettings(t *testing.T) {
	d := compile(t, "dns:\n  queryTypes: [a, TXT]\n  maxLabelLength: 20\n", nil)
	s := d.DNS()
	if !s.AllowsType(1) || !s.AllowsType(16) || s.AllowsType(28) {
		t.Errorf("query types = %v", s.QueryTypes)
	}
	if r := s.CheckName(strings.Repeat("a", 21) + ".com"); !strings.Contains(r, "label of 21") {
		t.Errorf("CheckName long label = %q", r)
	}
	def := compile(t, "{}", nil).DNS()
	if def.AllowsType(16) || !def.AllowsType(65) {
		t.Errorf("default query types = %v", def.QueryTypes)
	}
	if r := def.CheckName("mzxw6ytboi2dqnzrgezdgnbvgy3tqojq.t.example.com"); !strings.Contains(r, "entropy") {
		t.Errorf("base32 label passed the entropy guard: %q", r)
	}
	if r := def.CheckName("e3b0c44298fc1c149afbf4c8996fb924.cdn.example.com"); r != "" {
		t.Errorf("hex label refused: %q", r)
	}
}

// TestBuiltinDenyProviderEndpoints: every cloud provider control endpoint the base overlay
// lists is denied even when the sandbox policy allows it explicitly (an IP rule for an
// address, a name rule for a name) on top of defaultAction allow and a catch-all, and an
// address is dropped from a DNS answer of an allowed name too.
func TestBuiltinDenyProviderEndpoints(t *testing.T) {
	cases := []struct{ provider, target string }{
		{"aws-gcp-azure-oracle-do-imds", "169.254.169.254"},
		{"aws-imds-v6", "fd00:ec2::254"},
		{"aws-dns-v6", "fd00:ec2::253"},
		{"aws-time-sync", "169.254.169.123"},
		{"aws-time-sync-v6", "fd00:ec2::123"},
		{"aws-ecs-task-metadata", "169.254.170.2"},
		{"aws-eks-pod-identity", "169.254.170.23"},
		{"aws-eks-pod-identity-v6", "fd00:ec2::23"},
		{"azure-wireserver", "168.63.129.16"},
		{"alibaba-metadata", "100.100.100.200"},
		{"gcp-metadata-v6", "fd20:ce::254"},
		{"gcp-metadata-name", "metadata.google.internal"},
		{"gcp-metadata-short-name", "metadata"},
		{"tencent-metadata", "169.254.0.23"},
		{"tencent-metadata-name", "metadata.tencentyun.com"},
		{"ibm-metadata-name", "api.metadata.cloud.ibm.com"},
		{"scaleway-metadata", "169.254.42.42"},
		{"scaleway-metadata-v6", "fd00:42::42"},
	}
	var doc strings.Builder
	doc.WriteString("defaultAction: allow\negress:\n")
	for _, c := range cases {
		fmt.Fprintf(&doc, "  - {action: allow, target: %q}\n", c.target)
	}
	doc.WriteString("  - {action: allow, target: \"*\"}\n")
	d := compile(t, doc.String(), BaseOverlay())
	for _, c := range cases {
		t.Run(c.provider, func(t *testing.T) {
			for _, port := range []uint16{0, 80, 443} {
				got := d.Decide(c.target, port, TCP)
				if got.Action != Deny || !strings.HasPrefix(got.Rule, "overlay.alwaysDeny[") {
					t.Errorf("Decide(%s, %d) = %s %s (%s); want an overlay denial", c.target, port, got.Action, got.Rule, got.Reason)
				}
			}
			if a, err := netip.ParseAddr(c.target); err == nil {
				got := d.DecideLearned("allowed.example.com", a, 0, "")
				if got.Action != Deny || !strings.HasPrefix(got.Rule, "overlay.alwaysDeny[") {
					t.Errorf("DecideLearned(%s) = %s %s; want an overlay denial", c.target, got.Action, got.Rule)
				}
			}
		})
	}
	// report mode relaxes the policy, never the overlay
	rep := compile(t, "mode: report\n"+doc.String(), BaseOverlay())
	for _, c := range cases {
		if got := rep.Decide(c.target, 443, TCP); got.Action != Deny || got.WouldDeny {
			t.Errorf("report mode: Decide(%s) = %s would_deny=%t", c.target, got.Action, got.WouldDeny)
		}
	}
}
