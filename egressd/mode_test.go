package egressd

import (
	"net/netip"
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/policies"
)

// outcome is what the datapath does with a new flow to ap (no learned grant): allow,
// would (pass, reported as a would-drop) or drop.
func outcome(p datapath.Policy, ap netip.AddrPort) string {
	act := p.Default
	if r, ok := datapath.Match(p.Rules, ap.Addr(), datapath.ProtoTCP, ap.Port(), false); ok {
		act = r.Action
	}
	switch {
	case act == datapath.ActionAllow:
		return "allow"
	case act == datapath.ActionDenyAudit, act == datapath.ActionDeny && p.Report:
		return "would"
	}
	return "drop"
}

// TestCompileRuleModes: the datapath policy compile builds for rules in audit mode (and
// rules with mode: enforce in a policy in audit mode) passes, reports and drops exactly
// what the decider allows, would deny and denies, and a deny in audit mode covering
// special addresses (private, loopback) or the overlay still drops them.
func TestCompileRuleModes(t *testing.T) {
	ov := policies.BaseOverlay()
	ov.DenyAddrs(netip.MustParseAddr("192.0.2.1"))
	for _, c := range []struct {
		name, doc string
		want      map[string]string
	}{
		{"enforce policy, audited rules", `{"defaultAction":"deny","egress":[
			{"action":"deny","target":"203.0.113.0/24","mode":"audit"},
			{"action":"deny","target":"10.0.0.0/8","mode":"audit"},
			{"action":"allow","target":"10.1.0.0/16"},
			{"action":"deny","target":"*","ports":[25],"protocols":["tcp"],"mode":"audit"},
			{"action":"allow","target":"198.51.100.0/24"}]}`,
			map[string]string{"203.0.113.5:443": "would", "10.1.2.3:80": "drop", "10.2.0.1:80": "drop",
				"198.51.100.7:25": "would", "198.51.100.7:80": "allow", "127.0.0.1:25": "drop",
				"169.254.169.254:25": "drop", "192.0.2.1:25": "drop", "8.8.8.8:443": "drop"}},
		{"audit policy, an enforced rule", `{"mode":"audit","defaultAction":"deny","egress":[
			{"action":"deny","target":"203.0.113.0/24","mode":"enforce"},
			{"action":"deny","target":"198.51.100.0/24"},
			{"action":"deny","target":"0.0.0.0/0","ports":[22],"protocols":["tcp"]},
			{"action":"allow","target":"192.168.7.0/24"}]}`,
			map[string]string{"203.0.113.5:443": "drop", "198.51.100.7:80": "would", "8.8.8.8:443": "would",
				"8.8.8.8:22": "would", "10.1.2.3:22": "drop", "10.1.2.3:80": "drop", "192.168.7.1:80": "allow",
				"192.0.2.1:80": "drop", "169.254.169.254:80": "drop"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dec, err := policies.Load(c.name, []byte(c.doc), policies.CompileOptions{Overlay: ov})
			if err != nil {
				t.Fatal(err)
			}
			p, err := datapath.ValidatePolicy(compile(dec, compileOptions{}).policy)
			if err != nil {
				t.Fatal(err)
			}
			for s, want := range c.want {
				ap := netip.MustParseAddrPort(s)
				d := dec.DecideAddr(ap.Addr(), ap.Port(), policies.TCP)
				decided := "drop"
				if d.WouldDeny {
					decided = "would"
				} else if d.Allowed() {
					decided = "allow"
				}
				if decided != want {
					t.Errorf("%s: decider %s (%s), want %s (test table wrong?)", s, decided, d.Rule, want)
				}
				if got := outcome(p, ap); got != want {
					t.Errorf("%s: datapath %s, want %s (decider: %s)", s, got, want, d.Rule)
				}
			}
		})
	}
}
