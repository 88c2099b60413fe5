package policies

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// TestFloorNoRuleOverrides: every always-deny entry of the floor (built-in and the
// operator's: a host address, the sandbox network) stays denied under a policy that
// allows it explicitly, by name or address, at every port, with a catch-all and in
// report mode; each is reported InFloor, with a note. The guard's classes are listed
// as overridable. TestDecideOverlayPrecedence and TestBuiltinDenyProviderEndpoints
// check the same precedence rule by rule.
func TestFloorNoRuleOverrides(t *testing.T) {
	ov := BaseOverlay()
	ov.DenyAddrs(netip.MustParseAddr("192.0.2.10"))
	if err := ov.Deny("172.28.0.0/16", "fd00:a1e:6::/64"); err != nil {
		t.Fatal(err)
	}
	floor := ov.Floor()
	if len(floor) != len(ov.AlwaysDeny)+len(SpecialPrefixes()) {
		t.Fatalf("floor has %d entries, want %d", len(floor), len(ov.AlwaysDeny)+len(SpecialPrefixes()))
	}
	for _, mode := range []string{"enforce", "report"} {
		var doc strings.Builder
		fmt.Fprintf(&doc, "mode: %s\ndefaultAction: allow\negress:\n", mode)
		for _, e := range floor {
			if !e.Overridable {
				fmt.Fprintf(&doc, "  - {action: allow, target: %q}\n", e.Target)
			}
		}
		doc.WriteString("  - {action: allow, target: \"*\"}\n")
		d, err := Load("floor.yaml", []byte(doc.String()), CompileOptions{Overlay: ov})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range floor {
			if e.Note == "" {
				t.Errorf("%s %s has no note", e.Rule, e.Target)
			}
			if e.Overridable {
				continue
			}
			probe := strings.TrimPrefix(e.Target, "*.")
			if e.Target != probe {
				probe = "x." + probe
			}
			if p, err := netip.ParsePrefix(probe); err == nil {
				probe = p.Addr().Next().String()
			}
			for _, port := range []uint16{0, 80, 443} {
				dec := d.Decide(probe, port, TCP)
				if dec.Allowed() || !dec.InFloor() {
					t.Errorf("%s: %s at %d = %s by %s (InFloor %v); want the floor's denial", mode, probe, port, dec.Action, dec.Rule, dec.InFloor())
				}
			}
		}
	}
	if e := floor[0]; e.Source != "built-in" || e.Rule != "overlay.alwaysDeny[0]" || !strings.Contains(e.Note, "metadata") {
		t.Errorf("first entry: %+v", e)
	}
	if e := floor[len(BuiltinDeny)]; e.Source != "operator" || e.Target != "192.0.2.10" {
		t.Errorf("the host address: %+v", e)
	}
}
