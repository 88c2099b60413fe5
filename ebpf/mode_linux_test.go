package ebpf

import (
	"net/netip"
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// TestDenyAuditRule: a rule in audit mode (ACT_DENY_AUDIT) in an enforcing policy lets
// its destination pass with a would-drop event naming the rule, the flow then passes as
// established, a deny rule beside it still drops, and an Update enforcing the rule cuts
// the flow and drops.
func TestDenyAuditRule(t *testing.T) {
	p := verdictPolicy
	p.Rules = append([]datapath.Rule{
		{Prefix: pfx("198.18.7.0/24"), Action: datapath.ActionDenyAudit, ID: 7},
		{Prefix: pfx("198.18.8.0/24"), Action: datapath.ActionDeny, ID: 8},
	}, p.Rules...)
	e := newVerdictEnv(t, p)
	flow := tcp("10.77.0.2", "198.18.7.5", 44000, 22)
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActOK {
		t.Fatalf("a destination of a rule in audit mode: %d", got)
	}
	waitEvents(t, e.d, func(ev datapath.Event) bool {
		return ev.Kind == datapath.KindWouldDrop && ev.Rule == 7 && ev.Dst == netip.MustParseAddrPort("198.18.7.5:22")
	})
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActOK {
		t.Fatalf("the audited flow's next packet: %d", got)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, tcp("10.77.0.2", "198.18.8.5", 44001, 22)); got != tcActShot {
		t.Fatalf("a deny rule beside it: %d", got)
	}
	p.Rules[0].Action = datapath.ActionDeny
	if err := e.d.Update("verdict", p); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.run(t, e.d.objs.AirlockFromSbx, flow); got != tcActShot {
		t.Fatalf("the flow after the rule is enforced: %d", got)
	}
}
