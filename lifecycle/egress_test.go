package lifecycle

import (
	"net/netip"
	"slices"
	"testing"
)

func TestEgressSummary(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      Egress
	}{
		{"no policy", ``, Egress{AllowAll: true}},
		{"allow default", `{"defaultAction":"allow","egress":[]}`, Egress{AllowAll: true}},
		{"report mode", `{"mode":"report","defaultAction":"deny","egress":[]}`, Egress{AllowAll: true}},
		{"catch-all", `{"defaultAction":"deny","egress":[{"action":"allow","target":"*"}]}`, Egress{AllowAll: true}},
		{"names and cidrs", `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"},` +
			`{"action":"allow","target":"10.1.0.0/16"},{"action":"deny","target":"10.2.0.0/16"},{"action":"allow","target":"2001:db8::1"}]}`,
			Egress{ByName: true, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("2001:db8::1/128")}}},
		{"deny all", `{"defaultAction":"deny","egress":[]}`, Egress{}},
		{"deny rule in audit mode", `{"defaultAction":"deny","egress":[{"action":"deny","target":"10.2.0.0/16","mode":"audit"},` +
			`{"action":"deny","target":"10.3.0.0/16"}]}`, Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}},
		{"unparsable fails closed", `{"defaultAction":"maybe"}`, Egress{}},
	} {
		got := egressSummary("t", []byte(c.doc))
		if got.AllowAll != c.want.AllowAll || got.ByName != c.want.ByName || !slices.Equal(got.CIDRs, c.want.CIDRs) {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}
