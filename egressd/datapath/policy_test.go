package datapath

import (
	"errors"
	"net/netip"
	"testing"
)

func TestCompilePrefixesKeepsFirstMatch(t *testing.T) {
	rules := []Rule{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Proto: ProtoTCP, Ports: PortRange{443, 443}, Action: ActionAllow, ID: 1},
		{Prefix: netip.MustParsePrefix("10.1.0.0/16"), Action: ActionDeny, ID: 2},
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Action: ActionAllow, ID: 3},
	}
	table, err := CompilePrefixes(rules)
	if err != nil {
		t.Fatal(err)
	}
	// Longest match then first rule in the entry must equal Match over the policy.
	for _, c := range []struct {
		dst  string
		port uint16
	}{{"10.1.2.3", 443}, {"10.1.2.3", 80}, {"10.2.0.1", 80}, {"10.2.0.1", 443}} {
		dst := netip.MustParseAddr(c.dst)
		want, _ := Match(rules, dst, ProtoTCP, c.port, false)
		var best PrefixRules
		for _, pr := range table {
			if pr.Prefix.Contains(dst) && pr.Prefix.Bits() >= best.Prefix.Bits() {
				best = pr
			}
		}
		got, _ := Match(best.Rules, dst, ProtoTCP, c.port, false)
		if got.ID != want.ID {
			t.Errorf("%s:%d: table gives rule %d, policy %d", c.dst, c.port, got.ID, want.ID)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	good := Spec{ID: "a", HostIfindex: 3, HostIfname: "veth0", Addrs: []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.2")}}
	s, err := ValidateSpec(good)
	if err != nil || !s.Addrs[0].Is4() {
		t.Fatalf("good spec: %v %v", s.Addrs, err)
	}
	bad := []Spec{
		{HostIfindex: 3, HostIfname: "v", Addrs: good.Addrs},
		{ID: "a", HostIfname: "v", Addrs: good.Addrs},
		{ID: "a", HostIfindex: 3, HostIfname: "v"},
		{ID: "a", HostIfindex: 3, HostIfname: "v", Addrs: good.Addrs, Resolvers: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.9")}},
		{ID: "a", HostIfindex: 3, HostIfname: "v", Addrs: good.Addrs, Policy: Policy{Rules: []Rule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: PortRange{90, 80}, Action: ActionAllow}}}},
		{ID: "a", HostIfindex: 3, HostIfname: "v", Addrs: good.Addrs, Policy: Policy{Rules: []Rule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Proto: ProtoICMP, Ports: PortRange{80, 80}, Action: ActionAllow}}}},
		{ID: "a", HostIfindex: 3, HostIfname: "v", Addrs: good.Addrs, Policy: Policy{Default: 7}},
	}
	for i, b := range bad {
		if _, err := ValidateSpec(b); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("bad spec %d accepted: %v", i, err)
		}
	}
}

func TestAllows(t *testing.T) {
	p := Policy{Rules: []Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Action: ActionDeny}}, Default: ActionDeny}
	if Allows(p, netip.MustParseAddr("192.0.2.1"), ProtoTCP, 80, true) {
		t.Error("a static deny must beat a learned entry")
	}
	if !Allows(p, netip.MustParseAddr("198.51.100.1"), ProtoTCP, 80, true) {
		t.Error("learned must allow")
	}
	if Allows(p, netip.MustParseAddr("2001:db8::1"), ProtoTCP, 80, true) {
		t.Error("IPv6 blocked by default")
	}
}
