package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/principal"
)

// proposalEnv is a sandbox of a real server whose audit log the test writes into.
type proposalEnv struct {
	t    *testing.T
	c    *client
	aw   *audit.Writer
	dir  string
	id   string
	path string
}

// records appends recs to the sandbox's log and waits until they are readable.
func (e *proposalEnv) records(recs ...audit.Record) {
	e.t.Helper()
	count := func() int {
		got, _, err := audit.Query(e.dir, audit.Filter{SandboxID: e.id})
		if err != nil {
			e.t.Fatal(err)
		}
		return len(got)
	}
	n := count() + len(recs)
	for _, r := range recs {
		r.SandboxID, r.Time = e.id, time.Now()
		e.aw.Append(r)
	}
	for deadline := time.Now().Add(5 * time.Second); count() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatal("the records did not reach the log")
		}
	}
}

// proposal reads the sandbox's pending proposal.
func (e *proposalEnv) proposal() lifecycle.ProposalResponse {
	e.t.Helper()
	var p lifecycle.ProposalResponse
	if err := json.Unmarshal(e.c.want("GET", e.path, nil, http.StatusOK, ""), &p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// log returns every record of the log (all sandboxes).
func (e *proposalEnv) log() []audit.Record {
	e.t.Helper()
	time.Sleep(50 * time.Millisecond) // the decision's records reach the log
	recs, _, err := audit.Query(e.dir, audit.Filter{})
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

func denyName(name string) audit.Record {
	return audit.Record{Source: audit.SourceDNS, DstHost: name, Action: "deny"}
}

// TestPolicyProposalSaveAs: an approved proposal is written into the policy library
// as a named policy file (validated, atomic: no temporary file left), the library
// serves it at once and the sandbox runs under it; a taken name is 409 POLICY_EXISTS
// (the file untouched) unless replace, which makes the policy's next version; a user
// may not write the library (403) even on its own sandbox; the decision has a control
// record naming the principal and the library policy. The proposal leaves out the
// host's own addresses (Config.Floor with egressd.HostAddrs, as airlock up passes).
func TestPolicyProposalSaveAs(t *testing.T) {
	libDir := t.TempDir()
	taken := []byte("defaultAction: deny\negress:\n  - action: allow\n    target: taken.test\n")
	if err := os.WriteFile(filepath.Join(libDir, "taken.yaml"), taken, 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := library.Open(library.Config{Dir: libDir})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, SyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	floor := policies.BaseOverlay()
	hostAddrs := egressd.HostAddrs()
	floor.DenyAddrs(hostAddrs...)
	var hostAddr string
	for _, a := range hostAddrs {
		if a.Is4() && !a.IsLoopback() {
			hostAddr = a.String()
			break
		}
	}
	if hostAddr == "" {
		t.Fatalf("no IPv4 address of this host besides loopback: %v", hostAddrs)
	}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: aw, AuditDir: dir, Library: lib, Floor: floor})
	admin := newClient(t, h)
	user := admin.as(admin.newKey("agent-dev", principal.User).Key)
	req := baseReq(h.Image, nil)
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}}
	sb := user.create(req)
	e := &proposalEnv{t: t, c: admin, aw: aw, dir: dir, id: sb.ID, path: "/v1/sandboxes/" + sb.ID + "/policy/proposal"}

	e.records(denyName("learned.test"),
		audit.Record{Source: audit.SourceBPF, Proto: "tcp", DstIP: hostAddr, DstPort: 8080, Action: "deny"})
	p := e.proposal()
	if !p.Pending || !strings.Contains(p.YAML, "target: learned.test") {
		t.Fatalf("proposal: %s", p.YAML)
	}
	if strings.Contains(p.YAML, "target: "+hostAddr) {
		t.Errorf("the proposal allows the host's own address %s (the floor is not the host's):\n%s", hostAddr, p.YAML)
	}
	if len(p.Skipped) == 0 || p.Skipped[0].Target != hostAddr || !strings.Contains(p.Skipped[0].Reason, "platform floor") {
		t.Errorf("the host's address is not listed as skipped by the floor: %+v", p.Skipped)
	}

	approve := func(c *client, saveAs string, replace bool, status int, code string) []byte {
		t.Helper()
		return c.want("POST", e.path, lifecycle.ProposalDecision{Decision: "approve", Digest: p.Digest, SaveAs: saveAs, Replace: replace}, status, code)
	}
	approve(user, "learned", false, http.StatusForbidden, "FORBIDDEN")
	approve(admin, "taken", false, http.StatusConflict, "POLICY_EXISTS")
	if b, _ := os.ReadFile(filepath.Join(libDir, "taken.yaml")); string(b) != string(taken) {
		t.Errorf("a refused saveAs changed the existing file:\n%s", b)
	}
	approve(admin, "Not_A_Name", false, http.StatusBadRequest, "INVALID_REQUEST")
	admin.want("POST", e.path, lifecycle.ProposalDecision{Decision: "reject", Digest: p.Digest, SaveAs: "learned"}, http.StatusBadRequest, "INVALID_REQUEST")
	if !e.proposal().Pending {
		t.Fatal("refused decisions cleared the proposal")
	}

	var pr lifecycle.PolicyResponse
	if err := json.Unmarshal(approve(admin, "learned", false, http.StatusOK, ""), &pr); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(libDir, "learned.yaml")
	written, err := os.ReadFile(file)
	if err != nil || string(written) != p.YAML {
		t.Fatalf("learned.yaml is not the proposal (%v):\n%s", err, written)
	}
	if ents, _ := os.ReadDir(libDir); len(ents) != 2 {
		t.Errorf("the library directory holds %d entries, want taken.yaml and learned.yaml (a temporary file left?)", len(ents))
	}
	np, ok := lib.Get("learned")
	if !ok || np.Version != 1 || np.File != file {
		t.Fatalf("the library does not serve learned: %+v %v", np, ok)
	}
	d, err := policies.Load("applied", pr.Policy, policies.CompileOptions{Overlay: policies.BaseOverlay()})
	if err != nil || pr.Name != "learned" || !d.DecideName("learned.test", 443, policies.TCP).Allowed() ||
		!d.DecideName("pypi.org", 443, policies.TCP).Allowed() || d.DecideName("other.test", 443, policies.TCP).Allowed() {
		t.Fatalf("the sandbox's policy after the approval: name %q %s (%v)", pr.Name, pr.Policy, err)
	}
	admin.want("GET", "/v1/policies/learned", nil, http.StatusOK, "")
	if p := e.proposal(); p.Pending || p.LastDecision == nil || p.LastDecision.SavedAs != "learned" || p.LastDecision.Decision != "approve" {
		t.Errorf("after the approval: %+v", p)
	}

	// A second session: the same name is taken now, replace makes version 2.
	e.records(denyName("second.test"))
	p = e.proposal()
	if !p.Pending || !strings.Contains(p.YAML, "target: second.test") {
		t.Fatalf("second proposal: %s", p.YAML)
	}
	approve(admin, "learned", false, http.StatusConflict, "POLICY_EXISTS")
	approve(admin, "learned", true, http.StatusOK, "")
	if np, _ := lib.Get("learned"); np.Version != 2 || !strings.Contains(string(np.Source), "target: second.test") {
		t.Errorf("replace: %+v\n%s", np, np.Source)
	}

	// The records: a control record per decision (op policy.proposal) with the
	// principal, the successful ones naming the library policy; a policy record with
	// the library file.
	var control, approved int
	for _, r := range e.log() {
		if r.Source == audit.SourceControl && r.Extra["op"] == "policy.proposal" && r.SandboxID == sb.ID {
			if r.Extra["principal"] == nil || r.Extra["decision"] == nil {
				t.Errorf("control record without principal or decision: %+v", r.Extra)
			}
			if r.Extra["status"] == float64(http.StatusOK) {
				control++
				if r.Extra["target"] != "learned" || r.Extra["target_type"] != "policy" || r.Extra["principal"] != principal.ConfiguredAdminID {
					t.Errorf("approval's control record: %+v", r.Extra)
				}
			}
		}
		if r.Source == audit.SourcePolicy && r.Extra["change"] == "proposal-approved" && r.Action == "allow" {
			approved++
			if r.Extra["library_policy"] != "learned" || r.Extra["library_file"] != file {
				t.Errorf("approval's policy record: %+v", r.Extra)
			}
		}
	}
	if control != 2 || approved != 2 {
		t.Errorf("records of the two approvals: %d control, %d policy", control, approved)
	}
}

// TestPolicyProposalDecisionSurvivesRestart: a rejection is kept in the store: after
// the server restarts (a new process state on the same store and audit log) the
// rejected refusals are not proposed again, and the last decision is still reported
// with its principal; a refusal after the restart makes a new proposal.
func TestPolicyProposalDecisionSurvivesRestart(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, SyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h1 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: state, KeepContainers: true, Audit: aw, AuditDir: dir})
	c := newClient(t, h1)
	req := baseReq(h1.Image, nil)
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}}
	sb := c.create(req)
	e := &proposalEnv{t: t, c: c, aw: aw, dir: dir, id: sb.ID, path: "/v1/sandboxes/" + sb.ID + "/policy/proposal"}
	e.records(denyName("rejected.test"))
	p := e.proposal()
	if !p.Pending {
		t.Fatalf("proposal: %s", p.YAML)
	}
	c.want("POST", e.path, lifecycle.ProposalDecision{Decision: "reject", Digest: p.Digest}, http.StatusNoContent, "")
	e.log()
	h1.Stop()
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}

	aw2, err := audit.New(audit.Config{Dir: dir, SyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer aw2.Close()
	h2 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: state, Audit: aw2, AuditDir: dir})
	e.c, e.aw = newClient(t, h2), aw2
	after := e.proposal()
	if after.Pending || strings.Contains(after.YAML, "rejected.test") || after.AfterSeq != p.LastSeq ||
		after.LastDecision == nil || after.LastDecision.Decision != "reject" || after.LastDecision.Principal != principal.ConfiguredAdminID {
		t.Fatalf("after the restart the rejected proposal is back or its decision is lost: %+v\n%s", after, after.YAML)
	}
	e.records(denyName("later.test"))
	if p := e.proposal(); !p.Pending || !strings.Contains(p.YAML, "later.test") || strings.Contains(p.YAML, "rejected.test") {
		t.Errorf("a refusal after the restart: %s", p.YAML)
	}
}
