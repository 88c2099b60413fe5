package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/propose"
	"github.com/airlockdev/airlock/principal"
)

// ProposalResponse is a sandbox's pending policy proposal (GET
// /v1/sandboxes/{id}/policy/proposal): its current policy plus a rule, first, for each
// destination its audit records show refused (denied or would-deny) since the last
// decision on a proposal (package policies/propose).
type ProposalResponse struct {
	SandboxID string `json:"sandboxId"`
	// Pending is true when the proposal adds something (a rule marked new).
	Pending bool `json:"pending"`
	// Digest names this proposal (hex SHA-256 of YAML); a decision must quote it.
	Digest string `json:"digest"`
	// YAML is the proposed policy in the library's form, with counts per rule.
	YAML string `json:"yaml"`
	// Policy is the proposed policy (Airlock JSON form).
	Policy *policies.Policy `json:"policy"`
	// Rules and Skipped are propose.Result's.
	Rules   []propose.RuleReport `json:"rules"`
	Skipped []propose.Skipped    `json:"skipped,omitempty"`
	// AfterSeq is the last audit seq a previous decision covered (0: none);
	// LastSeq the last one this proposal read.
	AfterSeq uint64 `json:"afterSeq"`
	LastSeq  uint64 `json:"lastSeq"`
}

// ProposalDecision is the body of POST /v1/sandboxes/{id}/policy/proposal.
type ProposalDecision struct {
	// Decision is "approve" (the proposed policy replaces the sandbox's, as PUT
	// /policy does) or "reject".
	Decision string `json:"decision"`
	// Digest is the digest of the proposal decided on (ProposalResponse.Digest): a
	// proposal that changed since (new records) is 412 PRECONDITION_FAILED.
	Digest string `json:"digest"`
}

// proposalAPI serves a sandbox's pending policy proposal. Every decision is audited
// (source policy, extra.change proposal-approved or proposal-rejected, the principal,
// the digest); an approval also goes through the policy API's change (its own record).
// Decisions are remembered in memory (per sandbox, the last seq decided): a restart
// proposes from the whole log again.
type proposalAPI struct {
	pol *policyAPI
	dir string // the audit log (Config.AuditDir); empty answers 501

	mu      sync.Mutex
	decided map[string]uint64 // sandbox -> last seq a decision covered
}

func (a *proposalAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /sandboxes/{id}/policy/proposal", a.handleGet)
	m.HandleFunc("POST /sandboxes/{id}/policy/proposal", a.handleDecide)
}

// build computes the sandbox's proposal from the records after the last decision.
func (a *proposalAPI) build(id string) (*ProposalResponse, error) {
	if a.dir == "" {
		return nil, fmt.Errorf("%w: this server has no audit log (audit.dir)", ErrNotImplemented)
	}
	cur, _, err := storedPolicy(a.pol.reg, id)
	if err != nil {
		return nil, err
	}
	if cur == nil {
		if cur, err = policies.Parse(id, DefaultPolicy); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	after := a.decided[id]
	a.mu.Unlock()
	recs, _, err := audit.Query(a.dir, audit.Filter{SandboxID: id, AfterSeq: after})
	if err != nil {
		return nil, err
	}
	res, err := propose.Propose(recs, propose.Options{Base: cur})
	if err != nil {
		return nil, err
	}
	y, err := res.YAML(fmt.Sprintf("Proposed for sandbox %s from %d audit records after seq %d.", id, res.Records, after))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(y)
	resp := &ProposalResponse{SandboxID: id, Digest: hex.EncodeToString(sum[:]), YAML: string(y), Policy: res.Policy,
		Rules: res.Rules, Skipped: res.Skipped, AfterSeq: after, LastSeq: after}
	if len(recs) > 0 {
		resp.LastSeq = recs[len(recs)-1].Seq
	}
	for _, r := range res.Rules {
		resp.Pending = resp.Pending || r.New
	}
	return resp, nil
}

func (a *proposalAPI) exists(id string) bool { return a.pol.reg.peek(id, func(*record) {}) }

// handleGet answers GET /v1/sandboxes/{id}/policy/proposal.
func (a *proposalAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !a.exists(id) {
		fail(a.pol.log, w, r, ErrNotFound)
		return
	}
	resp, err := a.build(id)
	if err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, resp)
}

// handleDecide answers POST /v1/sandboxes/{id}/policy/proposal: approve applies the
// proposed policy (answered with the sandbox's policy once enforced, as PUT /policy),
// reject records the refusal (204). Both are audited with the principal.
func (a *proposalAPI) handleDecide(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var d ProposalDecision
	if err := decode(r, &d); err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	if d.Decision != "approve" && d.Decision != "reject" {
		fail(a.pol.log, w, r, fmt.Errorf("%w: decision must be approve or reject", ErrInvalidRequest))
		return
	}
	if !a.exists(id) {
		fail(a.pol.log, w, r, ErrNotFound)
		return
	}
	cur, err := a.build(id)
	if err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	if d.Digest != cur.Digest {
		fail(a.pol.log, w, r, fmt.Errorf("%w: the proposal changed (new records); read it again", ErrPrecondition))
		return
	}
	if !cur.Pending {
		fail(a.pol.log, w, r, fmt.Errorf("%w: nothing to decide: the sandbox's policy already allows what it did", ErrInvalidState))
		return
	}
	rec := audit.Record{Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
		Action: string(policies.Deny), Reason: "policy proposal rejected",
		Extra: map[string]any{"change": "proposal-rejected", "digest": cur.Digest, "last_seq": cur.LastSeq,
			"route": r.Method + " " + r.URL.Path, "principal": principal.IDFromContext(r.Context())}}
	if d.Decision == "approve" {
		err = a.pol.change(r, id, "put", func(*policies.Policy) (*policies.Policy, error) { return cur.Policy, nil })
		rec.Action, rec.Reason, rec.Extra["change"] = string(policies.Allow), "policy proposal approved: applied to the sandbox", "proposal-approved"
		if err != nil {
			rec.Action, rec.Reason = string(policies.Deny), "policy proposal approval failed: "+err.Error()
		}
	}
	if a.pol.audit != nil {
		a.pol.audit.Append(rec)
	}
	if err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	a.mu.Lock()
	if a.decided == nil {
		a.decided = map[string]uint64{}
	}
	a.decided[id] = cur.LastSeq
	a.mu.Unlock()
	a.pol.log.Info("policy proposal decided", "sandbox_id", id, "decision", d.Decision, "digest", cur.Digest)
	if d.Decision == "reject" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	a.pol.write(w, r, id)
}
