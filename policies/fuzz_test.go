package policies

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics; what it accepts compiles, decides, and survives a
// round trip through its JSON form unchanged. Seeds: f.Add below and
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"egress:\n  - {action: allow, target: \"*.example.com\", ports: [443, \"8000-8100\"], protocols: [tcp]}\n",
		`{"defaultAction":"allow","egress":[{"action":"deny","target":"10.0.0.0/8"}]}`,
		"mode: report\ndns:\n  queryTypes: [A]\n  tunnelGuard: {maxLabelEntropy: 3.5}\n",
		"egress: &a\n  - {action: allow, target: a.com}\nname: *a\n",
		"version: 1\negress: [{action: deny, target: '**'}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz", data)
		if err != nil {
			if p != nil {
				t.Fatal("policy returned with an error")
			}
			return
		}
		d, err := Compile(p, CompileOptions{Overlay: BaseOverlay()})
		if err != nil {
			t.Fatalf("parsed policy does not compile: %v", err)
		}
		for _, r := range p.Egress {
			d.Decide(strings.TrimPrefix(r.Target, "*."), 443, TCP)
			d.Decide(r.Target, 0, "")
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse("fuzz.json", b)
		if err != nil {
			t.Fatalf("JSON form does not parse: %v\n%s", err, b)
		}
		b2, _ := json.Marshal(q)
		if string(b) != string(b2) {
			t.Fatalf("round trip differs:\n%s\n%s", b, b2)
		}
	})
}

// FuzzMatchName compares the indexed decider with a direct, rule-by-rule evaluation for
// two rules and one name or address. Seeds: f.Add below and testdata/fuzz/FuzzMatchName.
func FuzzMatchName(f *testing.F) {
	f.Add("*.example.com", "example.com", "a.example.com")
	f.Add("example.com", "*", "EXAMPLE.com.")
	f.Add("10.0.0.0/8", "*", "10.1.2.3")
	f.Add("*.b.c", "a.b.c", "a.b.c")
	f.Add("2001:db8::/32", "**", "2001:db8::1")
	f.Add("*", "x.y", "192.168.1.1")
	f.Fuzz(func(t *testing.T, a, b, name string) {
		ta, errA := ParseTarget(a)
		tb, errB := ParseTarget(b)
		if errA != nil || errB != nil || ta.String() == tb.String() {
			return
		}
		doc, _ := json.Marshal(map[string]any{"egress": []map[string]string{
			{"action": "allow", "target": a}, {"action": "deny", "target": b}}})
		d, err := Load("fuzz", doc, CompileOptions{})
		if err != nil {
			t.Fatalf("valid targets %q %q do not load: %v", a, b, err)
		}
		got := d.Decide(name, 443, TCP)
		want := referenceDecide([]Target{ta, tb}, []Action{Allow, Deny}, name)
		if got.Action != want {
			t.Fatalf("rules [allow %s, deny %s], %q: decider %s (%s), reference %s", ta, tb, name, got.Action, got.Rule, want)
		}
		// any-port: the fast path (no port-limited rules) agrees with the port-range
		// evaluation, forced here by an unrelated port-limited rule
		slowDoc, _ := json.Marshal(map[string]any{"egress": []map[string]any{
			{"action": "allow", "target": a}, {"action": "deny", "target": b},
			{"action": "deny", "target": "unrelated.invalid", "ports": []int{1}}}})
		slow, err := Load("fuzz", slowDoc, CompileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fast, full := d.Decide(name, 0, ""), slow.Decide(name, 0, "")
		if fast.Action != full.Action || fast.Rule != full.Rule || fast.Ports.String() != full.Ports.String() {
			t.Fatalf("any-port %q: fast path %s %s %s, full evaluation %s %s %s", name, fast.Action, fast.Rule, fast.Ports, full.Action, full.Rule, full.Ports)
		}
	})
}

// referenceDecide evaluates rules one by one, as the README defines them.
func referenceDecide(ts []Target, as []Action, target string) Action {
	addr, err := netip.ParseAddr(strings.TrimSpace(target))
	if err == nil {
		addr = addr.WithZone("")
		special := Classify(addr).Special()
		for i, t := range ts {
			switch {
			case t.Kind == KindPrefix && t.Prefix.Contains(addr):
				return as[i]
			case t.Kind == KindAll && !(special && as[i] == Allow):
				return as[i]
			}
		}
		return Deny
	}
	name := NormalizeName(target)
	for i, t := range ts {
		switch {
		case t.Kind == KindAll,
			t.Kind == KindName && t.Name == name,
			t.Kind == KindWildcard && strings.HasSuffix(name, "."+t.Name):
			return as[i]
		}
	}
	return Deny
}
