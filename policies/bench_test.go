package policies

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// benchPolicy builds a policy of n rules: a third exact names, a third wildcards, a
// third CIDRs (half IPv6), with a catch-all deny last.
func benchPolicy(t testing.TB, n int) *Decider {
	var b strings.Builder
	b.WriteString("egress:\n")
	for i := range n - 1 {
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, "  - {action: allow, target: host%d.example%d.com, ports: [443]}\n", i, i%97)
		case 1:
			fmt.Fprintf(&b, "  - {action: allow, target: \"*.zone%d.example.net\"}\n", i)
		case 2:
			if i%2 == 0 {
				fmt.Fprintf(&b, "  - {action: allow, target: %d.%d.%d.0/24}\n", 11+i/65536%200, i/256%256, i%256)
			} else {
				fmt.Fprintf(&b, "  - {action: allow, target: \"2001:db8:%x::/48\"}\n", i)
			}
		}
	}
	b.WriteString("  - {action: deny, target: \"*\"}\n")
	d, err := Load("bench", []byte(b.String()), CompileOptions{Overlay: BaseOverlay()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBenchDecider reports ns per decision for names and addresses with 10 and 10,000
// rules; the ratios show the indexes keep lookups flat as policies grow.
func TestBenchDecider(t *testing.T) {
	testenv.NeedBench(t)
	perOp := map[string]float64{}
	for _, n := range []int{10, 10_000} {
		d := benchPolicy(t, n)
		names := []string{"host0.example0.com", "a.b.zone1.example.net", "nomatch.example.org", "deep.sub.domain.of.zone4.example.net"}
		addrs := []netip.Addr{netip.MustParseAddr("11.0.2.7"), netip.MustParseAddr("2001:db8:5::1"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("10.0.0.1")}
		cases := []struct {
			what string
			fn   func(i int)
		}{
			{"name", func(i int) { d.DecideName(names[i%len(names)], 443, TCP) }},
			{"ip", func(i int) { d.DecideAddr(addrs[i%len(addrs)], 443, TCP) }},
			{"name-anyport", func(i int) { d.DecideName(names[i%len(names)], 0, "") }},
		}
		for _, c := range cases {
			r := testing.Benchmark(func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					c.fn(i)
				}
			})
			key := fmt.Sprintf("%s/%d", c.what, n)
			perOp[key] = float64(r.NsPerOp())
			benchreport.Value("policies", fmt.Sprintf("decide %s, %d rules", c.what, n), "%d ns/op %d allocs/op", r.NsPerOp(), r.AllocsPerOp())
		}
	}
	for _, what := range []string{"name", "ip"} {
		benchreport.Ratio("policies", fmt.Sprintf("decide %s ns/op 10000 rules / 10 rules", what), perOp[what+"/10000"]/perOp[what+"/10"], "≤", 3)
	}
}
