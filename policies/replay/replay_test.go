package replay

import (
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// TestReplayRecordedLog writes a sandbox's traffic into a real audit log, reads it back
// as `airlock policy test` does, and replays it against a tighter candidate with known
// answers: github.com (name and flow) would be denied, a directly reached address the
// candidate now allows would be allowed, the rest is unchanged.
func TestReplayRecordedLog(t *testing.T) {
	dir := t.TempDir()
	w, err := audit.New(audit.Config{Dir: dir, SyncInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute)
	dns := func(i int, host, action string, answers ...string) audit.Record {
		r := audit.Record{Time: t0.Add(time.Duration(i) * time.Second), SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp",
			DstHost: host, QType: "A", Action: action}
		if len(answers) > 0 {
			r.Extra = map[string]any{"answers": answers}
		}
		return r
	}
	flow := func(i int, ip string, port int, action string) audit.Record {
		return audit.Record{Time: t0.Add(time.Duration(i) * time.Second), SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp",
			DstIP: ip, DstPort: port, Action: action}
	}
	for _, r := range []audit.Record{
		dns(0, "pypi.org", "allow", "151.101.0.223"),
		flow(1, "151.101.0.223", 443, "allow"),
		dns(2, "github.com", "allow", "140.82.112.3"),
		flow(3, "140.82.112.3", 443, "allow"),
		flow(4, "140.82.112.3", 443, "allow"),
		dns(5, "evil.test", "deny"),
		flow(6, "203.0.113.20", 80, "deny"),
		{Time: t0.Add(7 * time.Second), SandboxID: "sb1", Source: audit.SourceGateway, Action: "allow"},
	} {
		w.Append(r)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, _, err := audit.Query(dir, audit.Filter{SandboxID: "sb1"})
	if err != nil || len(recs) != 8 {
		t.Fatalf("recorded log: %d records, %v", len(recs), err)
	}
	d, err := policies.Load("candidate.yaml", []byte(`defaultAction: deny
egress:
  - action: allow
    target: pypi.org
  - action: allow
    target: 203.0.113.20/32
`), policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil {
		t.Fatal(err)
	}
	rep := Replay(d, recs)
	if rep.Records != 8 || rep.Evaluated != 7 || rep.Unchanged != 3 {
		t.Errorf("counts: %+v", rep)
	}
	if len(rep.WouldDeny) != 2 || rep.WouldDeny[0].Kind != "dns" || rep.WouldDeny[0].Target != "github.com" ||
		rep.WouldDeny[1].Target != "140.82.112.3:443/tcp" || rep.WouldDeny[1].Count != 2 ||
		len(rep.WouldDeny[1].Names) != 1 || rep.WouldDeny[1].Names[0] != "github.com" {
		t.Errorf("would deny: %+v", rep.WouldDeny)
	}
	if len(rep.WouldAllow) != 1 || rep.WouldAllow[0].Target != "203.0.113.20:80/tcp" || rep.WouldAllow[0].Was != "deny" {
		t.Errorf("would allow: %+v", rep.WouldAllow)
	}
}

// TestReplayHTTPRequests replays requests to a host with HTTP rules (l7 records with
// extra.http_rule): a candidate that allows GET under /repos/ only would deny the POST
// that was allowed and allow the GET that a stricter rule had denied; a request
// record read back from a log (extra as JSON values) decides the same way.
func TestReplayHTTPRequests(t *testing.T) {
	req := func(method, path, action string) audit.Record {
		return audit.Record{SandboxID: "sb1", Source: audit.SourceL7, Proto: "https", DstHost: "API.test", DstIP: "203.0.113.5",
			DstPort: 443, Action: action, Extra: map[string]any{"method": method, "path": path, "http_rule": true}}
	}
	d, err := policies.Load("candidate.yaml", []byte(`egress:
  - action: allow
    target: api.test
    http:
      rules:
        - {action: allow, methods: [GET], path: "/repos/*"}
`), policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil {
		t.Fatal(err)
	}
	rep := Replay(d, []audit.Record{
		req("GET", "/repos/a/b", "allow"),
		req("get", "/repos/a/c", "deny"),
		req("POST", "/repos/a/b", "allow"),
		req("POST", "/repos/a/b", "allow"),
		req("GET", "/REPOS/a", "allow"), // path case matters
		{SandboxID: "sb1", Source: audit.SourceL7, DstHost: "api.test", DstPort: 443, Action: "allow"}, // the connection
	})
	if rep.Evaluated != 5 || rep.Unchanged != 1 {
		t.Errorf("counts: %+v", rep)
	}
	if len(rep.WouldDeny) != 2 || rep.WouldDeny[0].Target != "POST https://api.test:443/repos/a/b" || rep.WouldDeny[0].Count != 2 ||
		rep.WouldDeny[0].Rule != "egress[0].http.default" || rep.WouldDeny[1].Target != "GET https://api.test:443/REPOS/a" {
		t.Errorf("would deny: %+v", rep.WouldDeny)
	}
	if len(rep.WouldAllow) != 1 || rep.WouldAllow[0].Kind != "http" || rep.WouldAllow[0].Rule != "egress[0].http.rules[0]" {
		t.Errorf("would allow: %+v", rep.WouldAllow)
	}
	// A would_deny action (audit mode) counts as refused.
	rec := req("GET", "/repos/x", "would_deny")
	if rep := Replay(d, []audit.Record{rec}); len(rep.WouldAllow) != 1 || rep.WouldAllow[0].Was != "deny" {
		t.Errorf("would_deny record: %+v", rep)
	}
}
