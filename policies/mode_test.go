package policies

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// TestModeParse: mode on the policy, on a deny rule, on an allow rule's HTTP rules and on
// a deny HTTP rule; "report" reads as audit; mode where it means nothing is refused.
func TestModeParse(t *testing.T) {
	p, err := Parse("m.yaml", []byte(`
mode: report
egress:
  - {action: deny, target: a.test, mode: enforce}
  - action: allow
    target: b.test
    mode: enforce
    http:
      rules: [{action: deny, methods: [DELETE], mode: audit}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != AuditMode || p.EffectiveMode() != AuditMode {
		t.Errorf("mode: report read as %q", p.Mode)
	}
	if got := p.RuleMode(&p.Egress[0]); got != Enforce {
		t.Errorf("RuleMode(egress[0]) = %q", got)
	}
	if !p.HasAuditRules() {
		t.Error("HasAuditRules = false")
	}
	b, _ := json.Marshal(p)
	if !strings.Contains(string(b), `"mode":"audit"`) {
		t.Errorf("JSON form %s", b)
	}
	if _, lossless := ToNetworkPolicy(&Policy{Egress: []Rule{{Action: Deny, Target: "x.test", Mode: AuditMode}}}); lossless {
		t.Error("a rule's mode is lost in the networkPolicy shape, yet lossless")
	}
	for _, bad := range []struct{ doc, want string }{
		{`{mode: learn}`, `mode: "learn" is not one of`},
		{`{egress: [{action: allow, target: a.test, mode: audit}]}`, "egress[0].mode: mode applies to a deny rule"},
		{`{egress: [{action: allow, target: a.test, http: {rules: [{action: allow, mode: audit}]}}]}`, "rules[0].mode: mode applies to a deny rule"},
	} {
		_, err := Parse("bad.yaml", []byte(bad.doc))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Parse(%s) = %v, want %q", bad.doc, err, bad.want)
		}
	}
	if _, err := ParseOverlay("ov.yaml", []byte(`{alwaysDeny: [{target: x.test, mode: audit}]}`)); err == nil ||
		!strings.Contains(err.Error(), "overlay is always enforced") {
		t.Errorf("mode in the overlay: %v", err)
	}
	if m, err := ParseMode("report"); err != nil || m != AuditMode {
		t.Errorf("ParseMode(report) = %q, %v", m, err)
	}
	if _, err := ParseMode("off"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseMode(off) = %v", err)
	}
}

// TestRuleModeDecisions: a deny rule in audit mode lets its destinations pass as
// would-deny naming the rule, a rule with mode: enforce in a policy in audit mode denies,
// and neither opens the floor (overlay, special addresses).
func TestRuleModeDecisions(t *testing.T) {
	d := compile(t, `
egress:
  - {action: deny, target: audited.test, mode: audit}
  - {action: deny, target: 203.0.113.0/24, mode: audit}
  - {action: deny, target: 10.0.0.0/8, mode: audit}
  - {action: deny, target: enforced.test}
  - {action: allow, target: "*.test"}
`, BaseOverlay())
	runCases(t, d, []decideCase{
		{"audited-name", "audited.test", 443, TCP, Allow, "egress[0]", true},
		{"audited-name-dns", "audited.test", 0, "", Allow, "egress[0]", true},
		{"audited-addr", "203.0.113.9", 443, TCP, Allow, "egress[1]", true},
		{"audited-special", "10.1.2.3", 443, TCP, Deny, "guard", false},
		{"enforced-name", "enforced.test", 443, TCP, Deny, "egress[3]", false},
		{"allowed", "ok.test", 443, TCP, Allow, "egress[4]", false},
		{"default", "203.0.114.1", 443, TCP, Deny, "default", false},
		{"metadata", "169.254.169.254", 80, TCP, Deny, "overlay.alwaysDeny[0]", false},
	})
	if dec := d.DecideName("audited.test", 0, ""); dec.Ports.Empty() {
		t.Error("a would-deny name carries no ports to learn")
	}
	for _, r := range d.IPRules() {
		if r.Rule == "egress[1]" && !r.Audit {
			t.Error("IPRule egress[1] not marked Audit")
		}
		if r.Overlay && r.Audit {
			t.Errorf("overlay rule %s marked Audit", r.Rule)
		}
	}

	a := compile(t, `
mode: audit
egress:
  - {action: deny, target: enforced.test, mode: enforce}
  - {action: deny, target: 203.0.113.0/24}
  - {action: allow, target: ok.test, ports: [443]}
`, BaseOverlay())
	runCases(t, a, []decideCase{
		{"enforced-rule", "enforced.test", 443, TCP, Deny, "egress[0]", false},
		{"enforced-rule-dns", "enforced.test", 0, "", Deny, "egress[0]", false},
		{"audited-rule", "203.0.113.9", 22, TCP, Allow, "egress[1]", true},
		{"audited-default", "other.test", 443, TCP, Allow, "default", true},
		{"audited-default-dns", "other.test", 0, "", Allow, "default", true},
		{"allowed-port", "ok.test", 443, TCP, Allow, "egress[2]", false},
		{"other-port", "ok.test", 22, TCP, Allow, "default", true},
		{"guard", "192.168.1.1", 80, TCP, Deny, "guard", false},
		{"host-loopback", "127.0.0.1", 80, TCP, Deny, "overlay.alwaysDeny[5]", false},
	})
}

// TestHTTPRuleMode: an HTTP deny rule in audit mode passes as would-deny naming the rule;
// the host's mode (its egress rule's) covers its default.
func TestHTTPRuleMode(t *testing.T) {
	d := compile(t, `
egress:
  - action: allow
    target: api.test
    http:
      rules:
        - {action: deny, methods: [DELETE], mode: audit}
        - {action: deny, methods: [PUT]}
      access: read-only
  - action: allow
    target: audited.test
    mode: audit
    http:
      rules:
        - {action: deny, methods: [PUT], mode: enforce}
      access: read-only
`, nil)
	ask := func(host, method string) Decision {
		dec := d.DecideName(host, 443, TCP)
		if dec.HTTP == nil {
			t.Fatalf("%s has no HTTP rules", host)
		}
		return dec.HTTP.Decide(HTTPRequest{Method: method, EscapedPath: "/x", Header: http.Header{}})
	}
	for _, c := range []struct {
		host, method string
		action       Action
		wouldDeny    bool
		rule         string
	}{
		{"api.test", "DELETE", Allow, true, "egress[0].http.rules[0]"},
		{"api.test", "PUT", Deny, false, "egress[0].http.rules[1]"},
		{"api.test", "POST", Deny, false, "egress[0].http.default"},
		{"api.test", "GET", Allow, false, "egress[0].http.access"},
		{"audited.test", "PUT", Deny, false, "egress[1].http.rules[0]"},
		{"audited.test", "POST", Allow, true, "egress[1].http.default"},
	} {
		got := ask(c.host, c.method)
		if got.Action != c.action || got.WouldDeny != c.wouldDeny || got.Rule != c.rule {
			t.Errorf("%s %s = %s would_deny=%t %s, want %s %t %s", c.method, c.host, got.Action, got.WouldDeny, got.Rule,
				c.action, c.wouldDeny, c.rule)
		}
	}
}
