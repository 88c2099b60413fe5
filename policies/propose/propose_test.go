package propose

import (
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/replay"
)

func dnsRec(host, action string, answers ...string) audit.Record {
	r := audit.Record{SandboxID: "sb", Source: audit.SourceDNS, DstHost: host, QType: "A", Action: action}
	if len(answers) > 0 {
		r.Extra = map[string]any{"answers": answers}
	}
	return r
}

func flowRec(ip string, port int, proto, action string) audit.Record {
	return audit.Record{SandboxID: "sb", Source: audit.SourceBPF, DstIP: ip, DstPort: port, Proto: proto, Action: action}
}

func reqRec(host string, port int, method, path, action string) audit.Record {
	return audit.Record{SandboxID: "sb", Source: audit.SourceL7, DstHost: host, DstPort: port, Proto: "https",
		Action: action, Extra: map[string]any{"method": method, "path": path, "http_rule": true}}
}

// session is a recorded session: two names reached (one of them on two ports), three
// sibling CDN names, a name denied at DNS, requests to a host with HTTP rules (some
// refused by them, one in audit mode), an address reached directly, and floor
// destinations (cloud metadata) that no proposal may allow.
func session() []audit.Record {
	return []audit.Record{
		dnsRec("pypi.org", "allow", "151.101.0.223"),
		flowRec("151.101.0.223", 443, "tcp", "allow"),
		dnsRec("files.example.com", "allow", "203.0.113.7"),
		flowRec("203.0.113.7", 443, "tcp", "allow"),
		flowRec("203.0.113.7", 8443, "tcp", "deny"),
		dnsRec("a.cdn.example.net", "allow", "198.51.100.1"),
		dnsRec("b.cdn.example.net", "deny"),
		dnsRec("c.cdn.example.net", "allow", "198.51.100.3"),
		flowRec("198.51.100.3", 443, "tcp", "allow"),
		dnsRec("denied.test", "deny"),
		dnsRec("api.test", "allow", "203.0.113.5"),
		reqRec("api.test", 443, "GET", "/repos/o/r", "allow"),
		reqRec("api.test", 443, "GET", "/repos/o/s/pulls", "allow"),
		reqRec("api.test", 443, "DELETE", "/repos/o/r", "deny"),
		reqRec("api.test", 443, "POST", "/v1/chat/completions", "would_deny"),
		reqRec("api.test", 443, "GET", "/", "allow"),
		reqRec("api.test", 443, "GET", "/a/../b", "deny"), // refused before any rule
		flowRec("192.0.2.44", 5432, "tcp", "deny"),
		flowRec("192.0.2.53", 53, "udp", "allow"),
		flowRec("169.254.169.254", 80, "tcp", "deny"),
		dnsRec("metadata.google.internal", "deny"),
		{SandboxID: "sb", Source: audit.SourceBPF, Action: audit.ActionSuppressed},
	}
}

// TestProposeSession: the proposal for a recorded session is valid YAML the parser
// reads back, holds one rule per destination with the ports seen, a wildcard for the
// sibling names, HTTP rules by method and path prefix for the host with HTTP rules,
// leaves the floor out, and replayed against the same records denies nothing that
// was allowed and allows everything that was refused (except the floor and the
// non-canonical path).
func TestProposeSession(t *testing.T) {
	recs := session()
	res, err := Propose(recs, Options{Name: "learned"})
	if err != nil {
		t.Fatal(err)
	}
	y, err := res.YAML("proposed from sandbox sb")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policies.Parse("proposal.yaml", y)
	if err != nil {
		t.Fatalf("the proposal does not parse: %v\n%s", err, y)
	}
	t.Logf("proposal:\n%s", y)
	var targets []string
	for _, r := range p.Egress {
		targets = append(targets, r.Target+" "+scope(r))
	}
	want := []string{"pypi.org tcp:443", "files.example.com tcp:443,8443", "*.cdn.example.net tcp:443",
		"denied.test all", "api.test tcp:443", "192.0.2.44 tcp:5432", "192.0.2.53 udp:53"}
	if strings.Join(targets, "|") != strings.Join(want, "|") {
		t.Errorf("rules:\n got %q\nwant %q", targets, want)
	}
	h := p.Egress[4].HTTP
	if h == nil || len(h.Rules) != 3 || h.Rules[0].Path != "/" || h.Rules[1].Path != "/repos/*" ||
		strings.Join(h.Rules[1].Methods, ",") != "DELETE,GET" || h.Rules[2].Path != "/v1/chat/completions" ||
		strings.Join(h.Rules[2].Methods, ",") != "POST" || h.Default != policies.Deny {
		t.Errorf("api.test http rules: %+v", h)
	}
	for _, s := range []string{"169.254.169.254", "metadata.google.internal", "api.test/a/../b"} {
		found := false
		for _, sk := range res.Skipped {
			found = found || sk.Target == s
		}
		if !found {
			t.Errorf("%s not listed as skipped: %+v", s, res.Skipped)
		}
	}
	if !strings.Contains(string(y), "# new: 4 records, 1 refused then; stands for a.cdn.example.net, b.cdn.example.net, c.cdn.example.net") {
		t.Errorf("no count comment for the wildcard:\n%s", y)
	}
	d, err := policies.Compile(p, policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil {
		t.Fatal(err)
	}
	rep := replay.Replay(d, recs)
	if len(rep.WouldDeny) != 0 {
		t.Errorf("replay: the proposal would deny what was allowed: %+v", rep.WouldDeny)
	}
	// What stays refused: the floor and the non-canonical path, unchanged.
	if len(rep.WouldAllow) != 6 || rep.Unchanged != rep.Evaluated-6 {
		t.Errorf("would allow %d (want 6: 8443, b.cdn, denied.test, DELETE, POST, 5432): %+v", len(rep.WouldAllow), rep.WouldAllow)
	}
	for _, target := range []string{"denied.test", "b.cdn.example.net", "DELETE https://api.test:443/repos/o/r", "POST https://api.test:443/v1/chat/completions", "192.0.2.44:5432/tcp"} {
		found := false
		for _, f := range rep.WouldAllow {
			found = found || f.Target == target
		}
		if !found {
			t.Errorf("replay: %s not allowed by the proposal: %+v", target, rep.WouldAllow)
		}
	}
	// A new host stays refused.
	if dec := d.DecideName("new.test", 443, policies.TCP); dec.Allowed() {
		t.Errorf("new.test allowed by the proposal: %+v", dec)
	}
}

// TestProposeBase: against a base that already allows pypi.org and api.test read-only
// (and denies denied.test), the proposal keeps the base and adds, first, only what it
// lacks: api.test's refused requests with the base's HTTP rules after them, and
// denied.test (the base's deny rule dropped).
func TestProposeBase(t *testing.T) {
	base, err := policies.Parse("base.yaml", []byte(`defaultAction: deny
egress:
  - {action: deny, target: denied.test}
  - {action: allow, target: pypi.org}
  - {action: allow, target: "*.cdn.example.net"}
  - {action: allow, target: files.example.com}
  - {action: allow, target: 192.0.2.0/24}
  - action: allow
    target: api.test
    http: {access: read-only}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Propose(session(), Options{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	y, _ := res.YAML("")
	p, err := policies.Parse("proposal.yaml", y)
	if err != nil {
		t.Fatalf("the proposal does not parse: %v\n%s", err, y)
	}
	t.Logf("proposal:\n%s", y)
	var targets []string
	for _, r := range p.Egress {
		targets = append(targets, string(r.Action)+" "+r.Target)
	}
	want := "allow denied.test|allow api.test|allow pypi.org|allow *.cdn.example.net|allow files.example.com|allow 192.0.2.0/24|allow api.test"
	if strings.Join(targets, "|") != want {
		t.Errorf("rules:\n got %s\nwant %s", strings.Join(targets, "|"), want)
	}
	if h := p.Egress[1].HTTP; h == nil || h.Access != policies.AccessReadOnly || len(h.Rules) != 3 {
		t.Errorf("api.test: want the proposed rules then the base's preset: %+v", h)
	}
	kept := 0
	for _, r := range res.Rules {
		if !r.New {
			kept++
		}
	}
	if kept != 5 { // pypi, files, cdn wildcard, 192.0.2.44, 192.0.2.53
		t.Errorf("kept %d rules, want 5: %+v", kept, res.Rules)
	}
}
