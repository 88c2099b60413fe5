package kube_test

import (
	"net/netip"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

// TestUpdateEgressDeny: with Config.Deny (the cluster's own ranges) no egress rule of
// the NetworkPolicy admits them, whatever the policy allows: a policy CIDR inside one is
// left out, a wider one excepts it, and allow-all becomes every address but them. The
// API server accepts each shape (an except must lie strictly inside its cidr).
func TestUpdateEgressDeny(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) {
		c.DNS = []netip.Addr{netip.MustParseAddr("169.254.20.10")}
		c.Deny = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("10.96.0.0/16"),
			netip.MustParsePrefix("fd00:10::/64")}
	})
	ctx := t.Context()
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "eg2", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}})
	if err != nil {
		t.Fatal(err)
	}
	nps := w.env.Client.NetworkingV1().NetworkPolicies(w.ns)
	dns := []string{"53: 169.254.20.10/32"}
	cidrs := func(s ...string) (out []netip.Prefix) {
		for _, c := range s {
			out = append(out, netip.MustParsePrefix(c))
		}
		return out
	}
	cases := []struct {
		name string
		eg   lifecycle.Egress
		want []string
	}{
		{"cidrs", lifecycle.Egress{CIDRs: cidrs("10.244.0.7/32", "10.96.0.0/16", "10.0.0.0/8", "203.0.113.0/24", "fd00:10::1/128", "fd00::/8")},
			append(slices.Clone(dns), "*: 10.0.0.0/8 except 10.244.0.0/24,10.96.0.0/16", "*: 203.0.113.0/24",
				"*: fd00::/8 except fd00:10::/64")},
		{"only_denied", lifecycle.Egress{CIDRs: cidrs("10.244.0.0/24")}, dns},
		{"by_name", lifecycle.Egress{ByName: true},
			append(slices.Clone(dns),
				"*: 0.0.0.0/0 except 10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,169.254.0.0/16,127.0.0.0/8",
				"*: ::/0 except fc00::/7,fe80::/10,::1/128")},
		{"allow_all", lifecycle.Egress{AllowAll: true, CIDRs: cidrs("10.244.0.0/24")},
			append(slices.Clone(dns), "*: 0.0.0.0/0 except 10.244.0.0/24,10.96.0.0/16", "*: ::/0 except fd00:10::/64")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := rt.UpdateEgress(ctx, inst, tc.eg); err != nil {
				t.Fatal(err)
			}
			np, err := nps.Get(ctx, "sbx-eg2", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := egressPeers(np); !slices.Equal(got, tc.want) {
				t.Errorf("egress %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestMissingEgress checks that a NetworkPolicy deleted by hand is reported missing
// (lifecycle's resync then rewrites it with UpdateEgress) and no longer once rewritten.
func TestMissingEgress(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	ctx := t.Context()
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "np1", Image: "airlock/sandbox:test", Entrypoint: []string{"sleep", "inf"}})
	if err != nil {
		t.Fatal(err)
	}
	// "gone" has no pod: nothing to repair (another replica may be removing it).
	if got, err := rt.MissingEgress(ctx, []string{"np1", "gone"}); err != nil || len(got) != 0 {
		t.Fatalf("missing %v (%v), want none", got, err)
	}
	if err := w.env.Client.NetworkingV1().NetworkPolicies(w.ns).Delete(ctx, kube.PodName("np1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := rt.MissingEgress(ctx, []string{"np1"}); err != nil || !slices.Equal(got, []string{"np1"}) {
		t.Fatalf("after the delete: missing %v (%v), want [np1]", got, err)
	}
	if err := rt.UpdateEgress(ctx, inst, lifecycle.Egress{}); err != nil {
		t.Fatal(err)
	}
	if got, err := rt.MissingEgress(ctx, []string{"np1"}); err != nil || len(got) != 0 {
		t.Fatalf("after UpdateEgress: missing %v (%v), want none", got, err)
	}
}
