package egressd

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/sdk"
)

// setPolicy changes sandbox id's policy through the lifecycle API (method PUT or
// PATCH, path after /policy, e.g. "?mode=enforce") and returns the new version, once
// the data plane enforces it (the harness's policy gate).
func (w *world) setPolicy(t *testing.T, id, method, query, body string) uint64 {
	t.Helper()
	req, _ := http.NewRequest(method, w.h.HTTP.URL+"/v1/sandboxes/"+id+"/policy"+query, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var pr struct {
		Version uint64 `json:"version"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &pr) != nil {
		t.Fatalf("%s /policy%s: %d %s", method, query, resp.StatusCode, b)
	}
	return pr.Version
}

// modeProbe is one thing the sandbox tries, and the rule that (would) deny it.
type modeProbe struct {
	what, cmd string
	passes    string       // stdout when it passes
	rule      string       // the rule that would deny it ("": allowed by the policy)
	source    audit.Source // audit source of the would_deny record
	// enforced is the audit source of the deny record when it differs (a denied name
	// is refused by the DNS filter before any connection).
	enforced audit.Source
}

// TestEgressdAuditMode runs a real sandbox on each datapath under a policy in audit mode
// (created so), then enforced (PATCH /policy?mode=enforce), then with its deny rules
// in audit mode (each rule's own mode) in an enforcing policy, then enforced again (PUT without
// the rule modes). In audit a denied name resolves, a connection to a denied address
// reaches the test's server and a denied HTTP request (plain, and HTTPS intercepted with
// the sandbox's CA) gets the upstream's answer, each audited would_deny with the rule;
// the platform floor (cloud metadata, the host) stays
// denied. Enforced, exactly the rules that would have denied deny.
func TestEgressdAuditMode(t *testing.T) {
	w, writes, intercept := rulesWorld(t, map[string]netip.Addr{"rules.test.": rulesIP,
		"allowed.test.": allowedIP, "denied.test.": deniedIP})
	doc := func(policyMode, ruleMode string) string {
		m := ""
		if ruleMode != "" {
			m = fmt.Sprintf(`,"mode":%q`, ruleMode)
		}
		pm := ""
		if policyMode != "" {
			pm = fmt.Sprintf(`"mode":%q,`, policyMode)
		}
		return `{` + pm + `"defaultAction":"deny","egress":[
		  {"action":"allow","target":"allowed.test"},
		  {"action":"deny","target":"denied.test"` + m + `},
		  {"action":"deny","target":"198.51.100.0/24"` + m + `},
		  {"action":"allow","target":"rules.test","http":{
		    "rules":[{"action":"deny","methods":["DELETE"]` + m + `}],"access":"read-only"}}]}`
	}
	resolve := `python3 -c "import socket;print(socket.gethostbyname('denied.test'))"`
	probes := []modeProbe{
		{"DNS of a denied name", resolve, deniedIP.String(), "egress[1]", audit.SourceDNS, ""},
		{"HTTP to a denied name", "curl -sS -m 5 http://denied.test/", "denied", "egress[1]", audit.SourceL7, audit.SourceDNS},
		{"a denied address", fmt.Sprintf("curl -sS -m 5 http://%s:8080/", cidrIP), "cidr", "egress[2]", audit.SourceBPF, ""},
		{"a denied HTTP request", "curl -sS -m 5 -X DELETE http://rules.test/repos/x", "DELETE /repos/x", "egress[3].http.rules[0]", audit.SourceL7, ""},
		{"a denied HTTPS request (intercepted)", "curl -sS -m 5 -X DELETE https://rules.test/repos/y", "DELETE /repos/y", "egress[3].http.rules[0]", audit.SourceL7, ""},
		{"an allowed HTTP request", "curl -sS -m 5 http://rules.test/repos/x", "GET /repos/x", "", "", ""},
		{"an allowed name", "curl -sS -m 5 http://allowed.test/", "allowed", "", "", ""},
	}
	floor := []modeProbe{
		{"cloud metadata", "curl -sS -m 3 http://169.254.169.254:8080/", "", "", "", ""},
		{"the host", fmt.Sprintf("curl -sS -m 3 http://%s:%d/", w.gw, w.hostPort), "", "", "", ""},
	}
	// run tries every probe; audited says whether the policy's denials are in audit.
	run := func(t *testing.T, sb *sdk.Sandbox, x *sdk.Execd, v uint64, audited bool) {
		for _, p := range probes {
			code, out := sh(t, x, p.cmd)
			passed := code == 0 && out == p.passes
			if want := p.rule == "" || audited; passed != want {
				t.Errorf("v%d: %s: passed=%t (%d %q), want %t", v, p.what, passed, code, out, want)
				continue
			}
			if p.rule == "" {
				continue
			}
			source := p.source
			if !audited && p.enforced != "" {
				source = p.enforced
			}
			w.waitAudit(t, sb.ID, fmt.Sprintf("v%d %s record", v, p.what), func(r audit.Record) bool {
				if r.Source != source || r.Rule != p.rule || r.PolicyVersion != v {
					return false
				}
				if audited {
					return r.Action == "allow" && r.WouldDeny
				}
				return r.Action == "deny" && !r.WouldDeny
			})
		}
		for _, p := range floor {
			if code, out := sh(t, x, p.cmd); code == 0 {
				t.Errorf("v%d: %s reached (%q): the floor must hold in every mode", v, p.what, out)
			}
		}
	}
	// rules returns the rules of sandbox id's would_deny (or deny) records at version v,
	// the platform floor's left out.
	rules := func(t *testing.T, id string, v uint64, wouldDeny bool) []string {
		recs, _, err := audit.Query(w.auditDir, audit.Filter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		for _, r := range recs {
			if r.PolicyVersion != v || r.Rule == "" || r.Rule == "guard" || strings.HasPrefix(r.Rule, "overlay.") {
				continue
			}
			if (wouldDeny && r.WouldDeny) || (!wouldDeny && r.Action == "deny") {
				set[r.Rule] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	want := []string{"egress[1]", "egress[2]", "egress[3].http.rules[0]"}
	w.eachBackend(t, doc("audit", ""), func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		writes.Store(0)
		phases := []struct {
			name    string
			audited bool
			change  func() uint64
		}{
			{"policy in audit (at create)", true, func() uint64 { v, _ := d.EnforcedVersion(sb.ID); return v }},
			{"policy enforced (PATCH ?mode=enforce)", false, func() uint64 { return w.setPolicy(t, sb.ID, http.MethodPatch, "?mode=enforce", "") }},
			{"rules in audit", true, func() uint64 { return w.setPolicy(t, sb.ID, http.MethodPut, "", doc("", "audit")) }},
			{"rules enforced", false, func() uint64 { return w.setPolicy(t, sb.ID, http.MethodPut, "", doc("", "")) }},
		}
		var wouldDeny []string
		for _, ph := range phases {
			v := ph.change()
			t.Logf("%s: policy version %d", ph.name, v)
			run(t, sb, x, v, ph.audited)
			got := rules(t, sb.ID, v, ph.audited)
			if !slices.Equal(got, want) {
				t.Errorf("%s: rules of the %s records %v, want %v", ph.name, map[bool]string{true: "would_deny", false: "deny"}[ph.audited], got, want)
			}
			if ph.audited {
				wouldDeny = got
			} else if !slices.Equal(got, wouldDeny) {
				t.Errorf("%s: denied %v, but would-denied %v before", ph.name, got, wouldDeny)
			}
		}
		if n := writes.Load(); n != 4 {
			t.Errorf("the server saw %d DELETE requests, want 4 (HTTP and HTTPS in the two phases in audit)", n)
		}
	}, intercept)
}
