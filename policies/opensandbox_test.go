package policies

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func targets(p *Policy) []string {
	var out []string
	for _, r := range p.Egress {
		out = append(out, string(r.Action)+" "+r.Target)
	}
	return out
}

func TestPatchIncomingWins(t *testing.T) {
	p, err := Parse("p", []byte(`{"defaultAction":"deny","egress":[
		{"action":"allow","target":"a.com"},
		{"action":"deny","target":"b.com"},
		{"action":"allow","target":"c.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ParseRules("patch", []byte(`[{"action":"allow","target":"B.com."},{"action":"deny","target":"b.com"},{"action":"deny","target":"d.com"}]`))
	if err != nil {
		t.Fatal(err)
	}
	q, err := Patch(p, rules)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"allow B.com.", "deny d.com", "allow a.com", "allow c.com"}
	if got := targets(q); !slices.Equal(got, want) {
		t.Errorf("Patch = %v, want %v", got, want)
	}
	if got := targets(p); len(got) != 3 {
		t.Errorf("Patch changed its input: %v", got)
	}
	d, err := Compile(q, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dec := d.DecideName("b.com", 443, TCP); dec.Action != Allow {
		t.Errorf("patched b.com = %s", dec.Action)
	}
}

func TestRemoveTargets(t *testing.T) {
	p, err := Parse("p", []byte(`{"egress":[{"action":"allow","target":"a.com"},{"action":"deny","target":"*.Blocked.org"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := ParseTargets("delete", []byte(`["*.blocked.org", "never-there.net"]`))
	if err != nil {
		t.Fatal(err)
	}
	q, err := RemoveTargets(p, ts)
	if err != nil {
		t.Fatal(err)
	}
	if got := targets(q); !slices.Equal(got, []string{"allow a.com"}) {
		t.Errorf("RemoveTargets = %v", got)
	}
	if _, err := ParseTargets("delete", []byte(`[]`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty target list: %v", err)
	}
	if _, err := ParseTargets("delete", []byte(`["foo.*.com"]`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad target: %v", err)
	}
	if _, err := ParseRules("patch", []byte(`[{"action":"allow"}]`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("rule without target: %v", err)
	}
}

func TestNetworkPolicyRoundTrip(t *testing.T) {
	np := NetworkPolicy{DefaultAction: Deny, Egress: []NetworkRule{{Allow, "pypi.org"}, {Deny, "*.x.org"}}}
	p, err := FromNetworkPolicy("np", np)
	if err != nil {
		t.Fatal(err)
	}
	back, lossless := ToNetworkPolicy(p)
	if !lossless || back.DefaultAction != Deny || !slices.Equal(back.Egress, np.Egress) {
		t.Errorf("round trip = %+v lossless=%t", back, lossless)
	}
	p.Egress[0].Ports = []PortRange{{443, 443}}
	if _, lossless := ToNetworkPolicy(p); lossless {
		t.Error("ports reported as lossless")
	}
	st := Status(p, "ebpf")
	b, _ := json.Marshal(st)
	if string(b) != `{"status":"ok","mode":"deny_all","enforcementMode":"ebpf","policyMode":"enforce","policy":{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"},{"action":"deny","target":"*.x.org"}]}}` {
		t.Errorf("status = %s", b)
	}
}

// TestJSONRoundTrip: the Airlock JSON form of a parsed policy parses to the same policy.
func TestJSONRoundTrip(t *testing.T) {
	p, err := Parse("full.yaml", mustRead(t, "testdata/valid/full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("full.json", b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	b2, _ := json.Marshal(q)
	if string(b) != string(b2) {
		t.Errorf("round trip differs:\n%s\n%s", b, b2)
	}
}
