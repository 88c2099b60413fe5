package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// TestPolicyAndAuditAPI drives Airlock's policy API, the OpenSandbox egress API on
// port 18080 through the server proxy, and the audit query on a real sandbox: every
// change is validated, persisted across a restart, published on the watch with a new
// version and audited.
func TestPolicyAndAuditAPI(t *testing.T) {
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, SyncInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	state := t.TempDir()
	h := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: state, KeepContainers: true, Audit: aw, AuditDir: dir})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}}
	sb := c.create(req)

	get := func(c *client) lifecycle.PolicyResponse {
		var pr lifecycle.PolicyResponse
		if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+sb.ID+"/policy", nil, http.StatusOK, ""), &pr); err != nil {
			t.Fatal(err)
		}
		return pr
	}
	pr := get(c)
	if pr.Version != 1 || pr.NetworkPolicy == nil || len(pr.NetworkPolicy.Egress) != 1 || pr.NetworkPolicy.Egress[0].Target != "pypi.org" {
		t.Fatalf("initial policy %+v", pr)
	}

	// A malformed document is rejected whole, with the line and reason; nothing changes.
	b := c.want("PUT", "/v1/sandboxes/"+sb.ID+"/policy", "defaultAction: deny\negress:\n  - action: allow\n    target: foo.*.com\n", http.StatusBadRequest, "INVALID_REQUEST")
	if !strings.Contains(string(b), "request body:4:") {
		t.Errorf("error without the line: %s", b)
	}
	if get(c).Version != 1 {
		t.Error("a rejected PUT changed the version")
	}
	c.want("PUT", "/v1/sandboxes/nope/policy", `{"defaultAction":"deny"}`, http.StatusNotFound, "SANDBOX_NOT_FOUND")

	// PUT an Airlock document (YAML).
	c.want("PUT", "/v1/sandboxes/"+sb.ID+"/policy", "defaultAction: deny\negress:\n  - action: allow\n    target: files.pythonhosted.org\n    ports: [443]\n", http.StatusOK, "")
	pr = get(c)
	if pr.Version != 2 || pr.Lossless {
		t.Errorf("after PUT: version %d lossless %v (ports do not fit the OpenSandbox shape)", pr.Version, pr.Lossless)
	}

	// PATCH merges (incoming first, first wins), DELETE removes targets.
	c.want("PATCH", "/v1/sandboxes/"+sb.ID+"/policy", `[{"action":"allow","target":"example.com"},{"action":"deny","target":"example.com"}]`, http.StatusOK, "")
	c.want("PATCH", "/v1/sandboxes/"+sb.ID+"/policy", `[]`, http.StatusBadRequest, "INVALID_REQUEST")
	p, err := policies.Parse("got", get(c).Policy)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Egress) != 2 || p.Egress[0].Target != "example.com" || p.Egress[0].Action != policies.Allow {
		t.Fatalf("after PATCH: %+v", p.Egress)
	}
	c.want("DELETE", "/v1/sandboxes/"+sb.ID+"/policy", `["example.com","not-there.org"]`, http.StatusOK, "")

	// The OpenSandbox egress API on port 18080, through the server proxy.
	egress := "/sandboxes/" + sb.ID + "/proxy/18080/policy"
	var st struct {
		Status string                  `json:"status"`
		Mode   string                  `json:"mode"`
		Policy *policies.NetworkPolicy `json:"policy"`
	}
	if err := json.Unmarshal(c.want("PATCH", egress, `[{"action":"allow","target":"*.npmjs.org"}]`, http.StatusOK, ""), &st); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(c.want("GET", "/v1"+egress, nil, http.StatusOK, ""), &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "ok" || st.Policy == nil || len(st.Policy.Egress) != 2 || st.Policy.Egress[0].Target != "*.npmjs.org" {
		t.Fatalf("egress API GET /policy = %+v", st)
	}
	c.want("DELETE", egress, `["*.npmjs.org"]`, http.StatusOK, "")
	c.want("PATCH", egress, `[{"action":"maybe","target":"x.org"}]`, http.StatusBadRequest, "INVALID_REQUEST")
	c.want("GET", "/sandboxes/"+sb.ID+"/proxy/18080/other", nil, http.StatusNotFound, "NOT_FOUND")

	// The watch carries the latest version; a restart keeps it.
	if w, ok := h.Server.Hub().Get(sb.ID); !ok || w.PolicyVersion != 6 {
		t.Errorf("watch policy version %d, want 6", w.PolicyVersion)
	}
	h.Stop()
	h2 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: state, AuditDir: dir})
	c2 := newClient(t, h2)
	if pr := get(c2); pr.Version != 6 || pr.NetworkPolicy == nil || len(pr.NetworkPolicy.Egress) != 1 || pr.NetworkPolicy.Egress[0].Target != "files.pythonhosted.org" {
		t.Errorf("after restart: %+v", pr)
	}

	// Every change is in the audit log, queryable per sandbox and time range.
	deadline := time.Now().Add(5 * time.Second)
	var ar lifecycle.AuditResponse
	for {
		since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		if err := json.Unmarshal(c2.want("GET", "/v1/sandboxes/"+sb.ID+"/audit?since="+since, nil, http.StatusOK, ""), &ar); err != nil {
			t.Fatal(err)
		}
		n := 0 // policy records (control-plane records of the calls are there too)
		for _, r := range ar.Records {
			if r.Source == audit.SourcePolicy {
				n++
			}
		}
		if n >= 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	applied, rejected := 0, 0
	for _, r := range ar.Records {
		if r.Source == audit.SourcePolicy && r.SandboxID == sb.ID {
			switch r.Action {
			case "allow":
				applied++
			case "deny":
				rejected++
			}
		}
	}
	if applied != 5 || rejected != 1 {
		t.Errorf("%d applied and %d rejected policy-change records, want 5 and 1: %+v", applied, rejected, ar.Records)
	}
	c2.want("GET", "/v1/sandboxes/"+sb.ID+"/audit?since=yesterday", nil, http.StatusBadRequest, "INVALID_REQUEST")
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if err := json.Unmarshal(c2.want("GET", "/v1/sandboxes/"+sb.ID+"/audit?since="+future, nil, http.StatusOK, ""), &ar); err != nil || len(ar.Records) != 0 {
		t.Errorf("records from the future: %+v %v", ar.Records, err)
	}
}

// TestPolicyPatchConcurrentAndDefault: concurrent PATCHes through the egress API never
// lose a rule, and a sandbox without a policy reports and patches from the data
// plane's default (allow), so one added rule does not cut everything else.
func TestPolicyPatchConcurrentAndDefault(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	sb := c.create(baseReq(h.Image, nil))
	egress := "/sandboxes/" + sb.ID + "/proxy/18080/policy"
	var st struct {
		Mode   string                  `json:"mode"`
		Policy *policies.NetworkPolicy `json:"policy"`
	}
	if err := json.Unmarshal(c.want("GET", egress, nil, http.StatusOK, ""), &st); err != nil {
		t.Fatal(err)
	}
	if st.Policy == nil || st.Policy.DefaultAction != policies.Allow || st.Mode != "allow_all" {
		t.Fatalf("policy-less sandbox: %+v", st)
	}
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c.want("PATCH", egress, fmt.Sprintf(`[{"action":"deny","target":"t%d.example.com"}]`, i), http.StatusOK, "")
		})
	}
	wg.Wait()
	if err := json.Unmarshal(c.want("GET", egress, nil, http.StatusOK, ""), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Policy.Egress) != n || st.Policy.DefaultAction != policies.Allow {
		t.Errorf("after %d concurrent PATCHes: default %s, %d rules", n, st.Policy.DefaultAction, len(st.Policy.Egress))
	}
	if _, v, _ := h.Server.Policy(sb.ID); v != n {
		t.Errorf("version %d after %d changes", v, n)
	}
}

// TestPolicyChangeAwaitsEnforcement: with a PolicyGate, a policy change on a Running
// sandbox answers only once the gate confirms the new version (what egressd reports),
// so the client's next command meets it.
func TestPolicyChangeAwaitsEnforcement(t *testing.T) {
	var enforced atomic.Uint64 // what the fake data plane enforces: nothing yet
	gate := func(_ string, v uint64) bool { return enforced.Load() >= v }
	h := lctest.New(t, lctest.Options{APIKey: testKey, PolicyGate: gate})
	c := newClient(t, h)
	sb := c.create(baseReq(h.Image, nil))
	c.waitState(sb.ID, opensandbox.Running)
	go func() {
		time.Sleep(200 * time.Millisecond)
		enforced.Store(100)
	}()
	c.want("PUT", "/v1/sandboxes/"+sb.ID+"/policy", `{"defaultAction":"allow"}`, http.StatusOK, "")
	if got := enforced.Load(); got < 100 {
		t.Fatalf("the policy change answered before the data plane enforced it (enforced version %d)", got)
	}
}
