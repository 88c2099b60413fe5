package sdk

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Proposal is a sandbox's pending policy proposal (GET
// /v1/sandboxes/{id}/policy/proposal, lifecycle/README.md): its current policy plus a
// rule, first, for each destination it was refused (denied or would-deny) since the
// last decision.
type Proposal struct {
	SandboxID string `json:"sandboxId"`
	// Pending is true when the proposal adds a rule.
	Pending bool `json:"pending"`
	// Digest names this proposal; a decision quotes it (412 when it changed since).
	Digest string `json:"digest"`
	// YAML is the proposed policy in the library's form, with counts per rule.
	YAML    string         `json:"yaml"`
	Rules   []ProposalRule `json:"rules"`
	Skipped []ProposalSkip `json:"skipped,omitempty"`
	// AfterSeq is the last audit seq the previous decision covered; LastSeq the last
	// this proposal read.
	AfterSeq uint64 `json:"afterSeq"`
	LastSeq  uint64 `json:"lastSeq"`
	// LastDecision is the previous decision (kept across server restarts); nil before
	// the first.
	LastDecision *ProposalMark `json:"lastDecision,omitempty"`
}

// ProposalRule is one rule of a proposal and the records it covers.
type ProposalRule struct {
	Rule    string `json:"rule"`
	Target  string `json:"target"`
	Scope   string `json:"scope"`
	Seen    int    `json:"seen"`
	Refused int    `json:"refused"`
	// New marks a rule the proposal adds.
	New bool `json:"new"`
}

// ProposalSkip is a destination seen and not proposed, with why (the platform floor).
type ProposalSkip struct {
	Target string `json:"target"`
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}

// ProposalMark is a decision on a proposal: approve or reject, by whom, and the
// library policy an approval wrote.
type ProposalMark struct {
	Decision  string    `json:"decision"`
	Digest    string    `json:"digest"`
	LastSeq   uint64    `json:"lastSeq"`
	Principal string    `json:"principal,omitempty"`
	At        time.Time `json:"at"`
	SavedAs   string    `json:"savedAs,omitempty"`
}

// ProposalDecision is the body of POST /v1/sandboxes/{id}/policy/proposal.
type ProposalDecision struct {
	// Decision is "approve" or "reject"; Digest the decided proposal's.
	Decision string `json:"decision"`
	Digest   string `json:"digest"`
	// SaveAs, with approve, writes the policy into the server's library under that
	// name and puts the sandbox under it (admin and operator keys only); a name taken
	// is 409 POLICY_EXISTS unless Replace.
	SaveAs  string `json:"saveAs,omitempty"`
	Replace bool   `json:"replace,omitempty"`
}

// PolicyProposal returns the sandbox's pending policy proposal (501 on a server
// without an audit log).
func (c *Client) PolicyProposal(ctx context.Context, id string) (*Proposal, error) {
	var p Proposal
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/policy/proposal", nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DecideProposal approves or rejects the sandbox's proposal. An approval answers the
// sandbox's policy once enforced; a rejection answers nil.
func (c *Client) DecideProposal(ctx context.Context, id string, d ProposalDecision) (*PolicyInfo, error) {
	var p PolicyInfo
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/policy/proposal", d, &p); err != nil {
		return nil, err
	}
	if d.Decision != "approve" {
		return nil, nil
	}
	return &p, nil
}
