package egressd

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/policies"
)

// TestCompileAddressSemantics checks the datapath policy compile produces against the
// decider's own answers for addresses dialled directly.
func TestCompileAddressSemantics(t *testing.T) {
	ov := policies.BaseOverlay()
	ov.DenyAddrs(netip.MustParseAddr("192.0.2.1"))
	for _, c := range []struct {
		name, doc string
		allowed   []string
		denied    []string
	}{
		{"default policy (allow)", string(DefaultPolicy),
			[]string{"203.0.113.10:443", "8.8.8.8:53"},
			[]string{"10.1.2.3:80", "172.17.0.1:80", "192.168.1.1:80", "127.0.0.1:80", "169.254.169.254:80", "100.64.0.1:80", "192.0.2.1:80"}},
		{"catch-all allow", `{"defaultAction":"deny","egress":[{"action":"allow","target":"*"}]}`,
			[]string{"203.0.113.10:443"},
			[]string{"10.1.2.3:80", "169.254.169.254:80"}},
		{"deny default, CIDR and port rules", `{"defaultAction":"deny","egress":[
			{"action":"allow","target":"10.9.0.0/16","ports":[8080],"protocols":["tcp"]},
			{"action":"deny","target":"198.51.100.7"},
			{"action":"allow","target":"198.51.100.0/24"}]}`,
			[]string{"10.9.1.1:8080", "198.51.100.8:22"},
			[]string{"10.9.1.1:8081", "198.51.100.7:80", "203.0.113.10:443"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec, err := policies.Load(c.name, []byte(c.doc), policies.CompileOptions{Overlay: ov})
			if err != nil {
				t.Fatal(err)
			}
			// Report mode relaxes the policy's denials, never the overlay's or the guard's:
			// the same document in report mode must still drop every special or overlay
			// address the decider denies, and pass the policy's own denials.
			var doc map[string]any
			if err := json.Unmarshal([]byte(c.doc), &doc); err != nil {
				t.Fatal(err)
			}
			doc["mode"] = "report"
			rdoc, _ := json.Marshal(doc)
			rdec, err := policies.Load(c.name, rdoc, policies.CompileOptions{Overlay: ov})
			if err != nil {
				t.Fatal(err)
			}
			rp, err := datapath.ValidatePolicy(compile(rdec, compileOptions{}).policy)
			if err != nil || !rp.Report {
				t.Fatalf("report policy: %+v %v", rp, err)
			}
			for _, s := range append(append([]string{}, c.allowed...), c.denied...) {
				ap := netip.MustParseAddrPort(s)
				hard := !rdec.DecideAddr(ap.Addr(), ap.Port(), policies.TCP).Allowed()
				r, ok := datapath.Match(rp.Rules, ap.Addr(), datapath.ProtoTCP, ap.Port(), false)
				if got := ok && r.Action == datapath.ActionDenyAlways; got != hard {
					t.Errorf("report mode: %s dropped by the datapath = %v, decider denies = %v", s, got, hard)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			p, err := datapath.ValidatePolicy(compile(dec, compileOptions{}).policy)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []struct {
				list []string
				ok   bool
			}{{c.allowed, true}, {c.denied, false}} {
				for _, s := range want.list {
					ap := netip.MustParseAddrPort(s)
					if got := datapath.Allows(p, ap.Addr(), datapath.ProtoTCP, ap.Port(), false); got != want.ok {
						t.Errorf("%s: datapath allows = %v, want %v", s, got, want.ok)
					}
					if got := dec.DecideAddr(ap.Addr(), ap.Port(), policies.TCP).Allowed(); got != want.ok {
						t.Errorf("%s: decider allows = %v, want %v (test table wrong?)", s, got, want.ok)
					}
				}
			}
		})
	}
}

// TestL7Scope: under l7: sni, a name allow rule without ports grants the learned
// address TCP 80 and 443 only; explicit ports and protocols, deny rules, addresses and
// "*" keep their meaning.
func TestL7Scope(t *testing.T) {
	p, err := policies.Parse("policy", []byte(`{"defaultAction":"deny","l7":"sni","egress":[
		{"action":"deny","target":"blocked.example"},
		{"action":"allow","target":"cdn.example"},
		{"action":"allow","target":"*.cdn.example"},
		{"action":"allow","target":"cdn.example","ports":[8443],"protocols":["tcp"]},
		{"action":"allow","target":"quic.example","protocols":["udp"]},
		{"action":"allow","target":"ssh.example","ports":[22]},
		{"action":"allow","target":"198.51.100.0/24"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	l7Scope(p)
	dec, err := policies.Compile(p, policies.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want string // the learned grants
	}{
		{"cdn.example", "tcp:80,443,8443"},
		{"a.cdn.example", "tcp:80,443"},
		{"quic.example", "udp:80,443"},
		{"ssh.example", "tcp:22 udp:22"},
	} {
		if got := dec.DecideName(c.name, 0, "").Ports.String(); got != c.want {
			t.Errorf("%s: ports %s, want %s", c.name, got, c.want)
		}
	}
	if dec.DecideName("blocked.example", 80, policies.TCP).Allowed() {
		t.Error("a deny rule was narrowed")
	}
	if !dec.DecideAddr(netip.MustParseAddr("198.51.100.7"), 8443, policies.UDP).Allowed() {
		t.Error("a CIDR rule was narrowed")
	}
	// Without the scope, the same document grants cdn.example every port.
	p, _ = policies.Parse("policy", []byte(`{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":"cdn.example"}]}`))
	dec, _ = policies.Compile(p, policies.CompileOptions{})
	if got := dec.DecideName("cdn.example", 0, "").Ports.String(); got != "all" {
		t.Errorf("unscoped: %s", got)
	}
	if got := learnedGrants(dec.DecideName("cdn.example", 0, "").Ports); got != nil {
		t.Errorf("unscoped grants %v, want every port", got)
	}
}
