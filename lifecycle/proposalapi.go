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
	"github.com/airlockdev/airlock/policies/library"
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
	// Digest names this proposal (hex SHA-256 of YAML); a decision must quote it. It
	// changes with the records the proposal uses (DNS answers, flows, L7 decisions),
	// not with others (control records, policy changes).
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
	// LastDecision is the last decision on the sandbox's proposal (kept in the store
	// across restarts); absent before the first.
	LastDecision *ProposalMark `json:"lastDecision,omitempty"`
}

// ProposalDecision is the body of POST /v1/sandboxes/{id}/policy/proposal.
type ProposalDecision struct {
	// Decision is "approve" (the proposed policy replaces the sandbox's, as PUT
	// /policy does, or with SaveAs goes into the library) or "reject".
	Decision string `json:"decision"`
	// Digest is the digest of the proposal decided on (ProposalResponse.Digest): a
	// proposal that changed since (new records) is 412 PRECONDITION_FAILED.
	Digest string `json:"digest"`
	// SaveAs, with approve, writes the proposed policy into the operator's library
	// (Config.Library's directory) as SaveAs.yaml and puts the sandbox under that named
	// policy (as PUT /policy?name=): a policy of that name already in the library is
	// 409 POLICY_EXISTS unless Replace. Only the admin and operator roles may write the
	// library (403 FORBIDDEN otherwise); a server without a library directory answers
	// 501. Empty: the policy is applied to the sandbox only.
	SaveAs string `json:"saveAs,omitempty"`
	// Replace lets SaveAs replace the library's policy of that name (its file keeps
	// its name; every sandbox under it gets the new version).
	Replace bool `json:"replace,omitempty"`
}

// ProposalMark is the last decision on a sandbox's policy proposal, kept with the
// sandbox's record in the store (it survives restarts) and shown as
// ProposalResponse.LastDecision.
type ProposalMark struct {
	// Decision is approve or reject.
	Decision string `json:"decision"`
	// Digest is the decided proposal's (ProposalResponse.Digest).
	Digest string `json:"digest"`
	// LastSeq is the last audit seq the decided proposal read: the next proposal reads
	// the records after it.
	LastSeq uint64 `json:"lastSeq"`
	// Principal is the id of the principal that decided (package principal).
	Principal string    `json:"principal,omitempty"`
	At        time.Time `json:"at"`
	// SavedAs is the library policy an approval wrote (ProposalDecision.SaveAs).
	SavedAs string `json:"savedAs,omitempty"`
}

// proposalRecords is what the proposal API needs of the sandbox registry (the
// Server) besides the policy API's: the last decision of a sandbox, kept with its
// record.
type proposalRecords interface {
	// markProposal stores m as sandbox id's last decision if the previous one covered
	// after (0: none), else ErrPrecondition. It writes the store.
	markProposal(id string, after uint64, m ProposalMark) error
}

// proposalAPI serves a sandbox's pending policy proposal. Every decision is audited
// (source policy, extra.change proposal-approved or proposal-rejected, the principal,
// the digest, the library policy written) besides its control record (op
// policy.proposal, extra.decision, target the library policy written); an approval
// also goes through the policy API's change (its own record). The last decision is
// kept with the sandbox's record in the store, so a restart does not propose again
// what was decided.
type proposalAPI struct {
	pol *policyAPI
	reg proposalRecords
	lib PolicyLibrary // Config.Library; nil: none (saveAs answers 501)
	dir string        // the audit log (Config.AuditDir); empty answers 501
	// floor is the operator overlay the sandboxes' policies compile under
	// (Config.Floor): what it always denies is never proposed.
	floor *policies.Overlay

	mu sync.Mutex // one decision at a time
}

func (a *proposalAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /sandboxes/{id}/policy/proposal", a.handleGet)
	m.HandleFunc("POST /sandboxes/{id}/policy/proposal", a.handleDecide)
}

// lastDecision is the sandbox's last decision (nil: none).
func (a *proposalAPI) lastDecision(id string) *ProposalMark {
	var m *ProposalMark
	a.pol.reg.peek(id, func(rec *record) {
		if rec.Proposal != nil {
			c := *rec.Proposal
			m = &c
		}
	})
	return m
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
	last := a.lastDecision(id)
	var after uint64
	if last != nil {
		after = last.LastSeq
	}
	recs, _, err := audit.Query(a.dir, audit.Filter{SandboxID: id, AfterSeq: after})
	if err != nil {
		return nil, err
	}
	res, err := propose.Propose(recs, propose.Options{Base: cur, Floor: a.floor})
	if err != nil {
		return nil, err
	}
	// The header counts the records the proposal used, not every record read: a
	// control record (a refused decision, say) must not change the digest.
	y, err := res.YAML(fmt.Sprintf("Proposed for sandbox %s from %d DNS answers, flows and L7 decisions after audit seq %d.", id, res.Used, after))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(y)
	resp := &ProposalResponse{SandboxID: id, Digest: hex.EncodeToString(sum[:]), YAML: string(y), Policy: res.Policy,
		Rules: res.Rules, Skipped: res.Skipped, AfterSeq: after, LastSeq: after, LastDecision: last}
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
// with saveAs through a new library policy the sandbox is put under; reject records
// the refusal (204). Both are audited with the principal and kept in the store.
func (a *proposalAPI) handleDecide(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var d ProposalDecision
	if err := decode(r, &d); err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	if d.Decision == "approve" || d.Decision == "reject" { // never an arbitrary string in the record
		noteControl(r, "decision", d.Decision)
	}
	if err := a.check(r, d); err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	if !a.exists(id) {
		fail(a.pol.log, w, r, ErrNotFound)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
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
	who := principal.IDFromContext(r.Context())
	mark := ProposalMark{Decision: d.Decision, Digest: cur.Digest, LastSeq: cur.LastSeq, Principal: who, At: time.Now().UTC()}
	rec := audit.Record{Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
		Action: string(policies.Deny), Reason: "policy proposal rejected",
		Extra: map[string]any{"change": "proposal-rejected", "digest": cur.Digest, "last_seq": cur.LastSeq,
			"route": r.Method + " " + r.URL.Path, "principal": who}}
	switch {
	case d.Decision == "reject":
		err = a.reg.markProposal(id, cur.AfterSeq, mark)
	case d.SaveAs != "":
		rec.Extra["change"] = "proposal-approved"
		var saved savedPolicy
		saved, err = a.approveIntoLibrary(r, id, d, cur)
		rec.Extra["library_policy"] = d.SaveAs
		if err == nil {
			mark.SavedAs = saved.Name
			rec.Extra["library_file"], rec.Extra["library_version"], rec.Extra["sha256"] = saved.File, saved.Version, saved.SHA256
			noteControl(r, "target_type", "policy")
			noteControl(r, "target", saved.Name)
			noteControl(r, "policy", saved.Name)
			rec.Action, rec.Reason = string(policies.Allow), "policy proposal approved: written into the library as "+saved.Name+" and applied to the sandbox"
		}
	default:
		rec.Extra["change"] = "proposal-approved"
		err = a.pol.change(r, id, "put", func(*policies.Policy) (*policies.Policy, error) { return cur.Policy, nil })
		if err == nil {
			rec.Action, rec.Reason = string(policies.Allow), "policy proposal approved: applied to the sandbox"
		}
	}
	if err == nil && d.Decision == "approve" {
		err = a.reg.markProposal(id, cur.AfterSeq, mark)
	}
	if err != nil && d.Decision == "approve" {
		rec.Action, rec.Reason = string(policies.Deny), "policy proposal approval failed: "+errorText(err)
	}
	if a.pol.audit != nil {
		a.pol.audit.Append(rec)
	}
	if err != nil {
		fail(a.pol.log, w, r, err)
		return
	}
	a.pol.log.Info("policy proposal decided", "sandbox_id", id, "decision", d.Decision, "digest", cur.Digest, "saved_as", d.SaveAs)
	if d.Decision == "reject" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	a.pol.write(w, r, id)
}

// check validates a decision before anything is read: its verb, and that saveAs comes
// with approve from a role that may write the library (admin, operator).
func (a *proposalAPI) check(r *http.Request, d ProposalDecision) error {
	if d.Decision != "approve" && d.Decision != "reject" {
		return fmt.Errorf("%w: decision must be approve or reject", ErrInvalidRequest)
	}
	if d.SaveAs == "" {
		if d.Replace {
			return fmt.Errorf("%w: replace needs saveAs", ErrInvalidRequest)
		}
		return nil
	}
	if d.Decision != "approve" {
		return fmt.Errorf("%w: saveAs goes with approve", ErrInvalidRequest)
	}
	if !library.ValidName(d.SaveAs) {
		return fmt.Errorf("%w: saveAs %q: a policy name is a DNS label (lowercase letters, digits, '-', at most 63)", ErrInvalidRequest, d.SaveAs)
	}
	if p, _ := principal.FromContext(r.Context()); p.Role != principal.Admin && p.Role != principal.Operator {
		return fmt.Errorf("%w: the %s role of %s may not write the policy library (saveAs needs admin or operator)", ErrForbidden, p.Role, p.ID)
	}
	return nil
}

// approveIntoLibrary writes cur's policy into the library as d.SaveAs and puts the
// sandbox under it, audited as PUT /policy?name= is (change named).
func (a *proposalAPI) approveIntoLibrary(r *http.Request, id string, d ProposalDecision, cur *ProposalResponse) (savedPolicy, error) {
	saved, err := writeLibraryPolicy(a.lib, d.SaveAs, []byte(cur.YAML), cur.Policy, d.Replace)
	if err != nil {
		return saved, err
	}
	a.pol.log.Info("approved policy proposal written into the library", "sandbox_id", id, "policy", saved.Name,
		"file", saved.File, "version", saved.Version, "sha256", saved.SHA256)
	return saved, a.pol.setNamed(r, id, saved.Name)
}

// errorText is err's text for an audit record: a user-facing error's, else
// "internal error" (internal errors are logged, not recorded).
func errorText(err error) string {
	if _, body, internal := httpError(err); !internal {
		return body.Message
	}
	return "internal error"
}

// markProposal stores m as sandbox id's last proposal decision (proposalRecords).
func (s *Server) markProposal(id string, after uint64, m ProposalMark) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	var prev uint64
	if e.rec.Proposal != nil {
		prev = e.rec.Proposal.LastSeq
	}
	if prev != after {
		return fmt.Errorf("%w: another decision on this proposal came first; read it again", ErrPrecondition)
	}
	old := e.rec.Proposal
	e.rec.Proposal = &m
	if err := putRecord(s.store, e.rec); err != nil {
		e.rec.Proposal = old
		return fmt.Errorf("store: %w", err)
	}
	return nil
}
