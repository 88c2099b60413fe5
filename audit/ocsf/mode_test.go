package ocsf

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// TestWouldDenyEvents: a would_deny record of every egress source (a DNS answer, a flow,
// a connection through the L7 proxy, an HTTP request checked by an HTTP rule), from a
// policy or a rule in audit mode, is exported as an event the schema validates, with
// action Allowed, disposition Detected (the control saw what it would have blocked),
// the rule that would have denied as firewall_rule.name and the mode and would_deny in
// unmapped; the same record enforced is Denied/Blocked.
func TestWouldDenyEvents(t *testing.T) {
	now := time.Date(2026, 11, 26, 23, 0, 0, 0, time.UTC)
	recs := []audit.Record{
		{Time: now, SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp", Src: "10.88.0.5:40000", DstHost: "denied.test", QType: "A",
			Action: "allow", Mode: "audit", WouldDeny: true, Rule: "egress[1]", Reason: "deny denied.test", PolicyVersion: 1,
			Extra: map[string]any{"answers": []string{"203.0.113.20"}, "rcode": "NOERROR", "ttl_s": 300}},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", Src: "10.88.0.5:41000", DstIP: "198.51.100.10", DstPort: 8080,
			Action: "allow", Mode: "enforce", WouldDeny: true, Rule: "egress[2]", Reason: "rule_deny", PolicyVersion: 3,
			Extra: map[string]any{"backend": "ebpf"}},
		{Time: now, SandboxID: "sb1", Source: audit.SourceL7, Proto: "http", Src: "10.88.0.5:41001", DstHost: "denied.test", DstIP: "203.0.113.20",
			DstPort: 80, Action: "allow", Mode: "audit", WouldDeny: true, Rule: "egress[1]", Reason: "deny denied.test", PolicyVersion: 1},
		{Time: now, SandboxID: "sb1", Source: audit.SourceL7, Proto: "https", Src: "10.88.0.5:41002", DstHost: "rules.test", DstIP: "203.0.113.30",
			DstPort: 443, Action: "allow", Mode: "audit", WouldDeny: true, Rule: "egress[3].http.rules[0]", Reason: "deny DELETE", PolicyVersion: 3,
			Extra: map[string]any{"method": "DELETE", "path": "/repos/x", "http_rule": true}},
		{Time: now, SandboxID: "sb1", Source: audit.SourceL7, Proto: "https", Src: "10.88.0.5:41003", DstHost: "rules.test", DstIP: "203.0.113.30",
			DstPort: 443, Action: "deny", Mode: "enforce", Rule: "egress[3].http.rules[0]", Reason: "deny DELETE", PolicyVersion: 4,
			Extra: map[string]any{"method": "DELETE", "path": "/repos/x", "http_rule": true}},
	}
	events, _ := readEvents(t, writeLog(t, recs, 0))
	if len(events) != len(recs) {
		t.Fatalf("%d events for %d records", len(events), len(recs))
	}
	s := testSchema(t)
	for i, ev := range events {
		b, _ := json.Marshal(ev)
		if errs := s.validateEvent(ev, classNamesByUID); len(errs) > 0 {
			t.Errorf("event %d invalid:\n  %s\n%s", i, strings.Join(errs, "\n  "), b)
		}
		r := recs[i]
		action, disposition := "Allowed", "Detected"
		if !r.WouldDeny {
			action, disposition = "Denied", "Blocked"
		}
		fr, _ := ev["firewall_rule"].(map[string]any)
		um, _ := ev["unmapped"].(map[string]any)
		if ev["action"] != action || ev["disposition"] != disposition || fr == nil || fr["name"] != r.Rule ||
			um["mode"] != r.Mode || (um["would_deny"] == true) != r.WouldDeny {
			t.Errorf("event %d (%s would_deny=%t): want %s/%s naming %s, mode %s:\n%s", i, r.Source, r.WouldDeny, action, disposition, r.Rule, r.Mode, b)
		}
	}
}
