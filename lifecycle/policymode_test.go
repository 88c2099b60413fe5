package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/policies"
)

// TestPolicyModeAPI: a sandbox created with its policy in audit mode reports it through
// the OpenSandbox egress API (policyMode), PATCH /policy?mode=enforce switches it with
// an empty body and keeps the rules (a rule's own mode included), and an unknown mode is
// refused without a change.
func TestPolicyModeAPI(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["networkPolicy"] = map[string]any{"mode": "audit", "defaultAction": "deny", "egress": []any{
		map[string]any{"action": "allow", "target": "pypi.org"},
		map[string]any{"action": "deny", "target": "evil.test", "mode": "audit"},
	}}
	sb := c.create(req)
	egress := "/sandboxes/" + sb.ID + "/proxy/18080/policy"
	status := func(b []byte) (mode string, p *policies.Policy) {
		var st struct {
			PolicyMode string `json:"policyMode"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		var pr struct {
			Policy json.RawMessage `json:"policy"`
		}
		if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+sb.ID+"/policy", nil, http.StatusOK, ""), &pr); err != nil {
			t.Fatal(err)
		}
		p, err := policies.Parse("stored", pr.Policy)
		if err != nil {
			t.Fatal(err)
		}
		return st.PolicyMode, p
	}
	if mode, p := status(c.want("GET", egress, nil, http.StatusOK, "")); mode != "audit" || p.EffectiveMode() != policies.AuditMode {
		t.Fatalf("created in audit mode: policyMode %q, stored %q", mode, p.Mode)
	}
	c.want("PATCH", egress+"?mode=learn", nil, http.StatusBadRequest, "INVALID_REQUEST")
	mode, p := status(c.want("PATCH", egress+"?mode=enforce", nil, http.StatusOK, ""))
	if mode != "enforce" || p.EffectiveMode() != policies.Enforce || len(p.Egress) != 2 || p.Egress[1].Mode != policies.AuditMode {
		t.Fatalf("after ?mode=enforce: policyMode %q, policy %+v", mode, p)
	}
	// With rules and a mode in one call.
	mode, p = status(c.want("PATCH", "/v1"+egress+"?mode=audit", `[{"action":"allow","target":"example.com"}]`, http.StatusOK, ""))
	if mode != "audit" || len(p.Egress) != 3 || p.Egress[0].Target != "example.com" {
		t.Fatalf("after a PATCH with rules and ?mode=audit: policyMode %q, policy %+v", mode, p)
	}
}
