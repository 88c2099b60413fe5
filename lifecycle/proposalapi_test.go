package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/policies"
)

// TestPolicyProposalAPI: a sandbox's refusals (a name denied at DNS, a request refused
// by an HTTP rule, a would-deny) become a pending proposal on top of its policy; a
// decision must quote the proposal's digest; a rejection is audited with the
// principal and clears the pending proposal until new refusals arrive; an approval
// applies the proposed policy to the sandbox (a new version that allows what was
// refused) and is audited with the principal.
func TestPolicyProposalAPI(t *testing.T) {
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, SyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: aw, AuditDir: dir})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}}
	sb := c.create(req)
	path := "/v1/sandboxes/" + sb.ID + "/policy/proposal"
	count := func() int {
		recs, _, err := audit.Query(dir, audit.Filter{SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}
	appendSync := func(recs ...audit.Record) { // append and wait until readable
		n := count() + len(recs)
		for _, r := range recs {
			r.SandboxID, r.Time = sb.ID, time.Now()
			aw.Append(r)
		}
		for deadline := time.Now().Add(5 * time.Second); count() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the records did not reach the log")
			}
		}
	}
	get := func() lifecycle.ProposalResponse {
		var p lifecycle.ProposalResponse
		if err := json.Unmarshal(c.want("GET", path, nil, http.StatusOK, ""), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	appendSync(
		audit.Record{Source: audit.SourceDNS, DstHost: "pypi.org", Action: "allow", Extra: map[string]any{"answers": []string{"151.101.0.223"}}},
		audit.Record{Source: audit.SourceDNS, DstHost: "new.test", Action: "deny"},
		audit.Record{Source: audit.SourceDNS, DstHost: "audit.test", Action: "would_deny"},
	)
	p := get()
	if !p.Pending || !strings.Contains(p.YAML, "target: new.test") || !strings.Contains(p.YAML, "target: audit.test") ||
		p.Policy == nil || p.Policy.Egress[len(p.Policy.Egress)-1].Target != "pypi.org" {
		t.Fatalf("proposal: %+v\n%s", p, p.YAML)
	}
	c.want("POST", path, map[string]string{"decision": "reject", "digest": "stale"}, http.StatusPreconditionFailed, "PRECONDITION_FAILED")
	c.want("POST", path, map[string]string{"decision": "maybe", "digest": p.Digest}, http.StatusBadRequest, "INVALID_REQUEST")
	c.want("POST", path, map[string]string{"decision": "reject", "digest": p.Digest}, http.StatusNoContent, "")
	if p := get(); p.Pending || p.Rules == nil {
		t.Errorf("after the rejection the proposal is still pending, or its rules are null (the console lists them): %+v", p)
	}
	appendSync(audit.Record{Source: audit.SourceL7, DstHost: "pypi.org", DstPort: 443, Action: "deny", Proto: "https"},
		audit.Record{Source: audit.SourceDNS, DstHost: "later.test", Action: "deny"})
	p = get()
	if !p.Pending || !strings.Contains(p.YAML, "target: later.test") || strings.Contains(p.YAML, "new.test") {
		t.Fatalf("second proposal: %s", p.YAML)
	}
	var pr lifecycle.PolicyResponse
	if err := json.Unmarshal(c.want("POST", path, map[string]string{"decision": "approve", "digest": p.Digest}, http.StatusOK, ""), &pr); err != nil {
		t.Fatal(err)
	}
	d, err := policies.Load("applied", pr.Policy, policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil || pr.Version != 2 || !d.DecideName("later.test", 443, policies.TCP).Allowed() || d.DecideName("other.test", 443, policies.TCP).Allowed() {
		t.Fatalf("applied policy v%d %s (%v)", pr.Version, pr.Policy, err)
	}
	time.Sleep(100 * time.Millisecond) // the decision records reach the log
	recs, _, err := audit.Query(dir, audit.Filter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		if ch, _ := r.Extra["change"].(string); r.Source == audit.SourcePolicy && strings.HasPrefix(ch, "proposal-") {
			if pid, _ := r.Extra["principal"].(string); pid == "" {
				t.Errorf("%s recorded without the principal: %+v", ch, r)
			}
			seen[ch] = true
		}
	}
	if !seen["proposal-rejected"] || !seen["proposal-approved"] {
		t.Errorf("decisions audited: %v", seen)
	}
	c.want("GET", "/v1/sandboxes/nope/policy/proposal", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
}
