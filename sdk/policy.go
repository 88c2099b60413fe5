package sdk

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit/record"
)

// PolicyInfo is a sandbox's stored egress policy as Airlock's policy API reports it
// (GET and PUT /v1/sandboxes/{id}/policy, lifecycle/README.md).
type PolicyInfo struct {
	SandboxID string `json:"sandboxId"`
	// Name is the library policy the sandbox runs under (Policy is then that policy
	// with the sandbox's additions first); empty for a policy of its own.
	Name string `json:"name,omitempty"`
	// Version increases with every change.
	Version uint64 `json:"version"`
	// Policy is the document in Airlock's JSON form; null when the sandbox has none
	// (the operator's default applies).
	Policy json.RawMessage `json:"policy"`
	// Lossless is false when the policy uses Airlock extensions the OpenSandbox
	// networkPolicy shape cannot carry.
	Lossless bool `json:"lossless"`
}

// Policy returns the sandbox's egress policy.
func (c *Client) Policy(ctx context.Context, id string) (*PolicyInfo, error) {
	var p PolicyInfo
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/policy", nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SetPolicy replaces the sandbox's egress policy with doc (JSON, Airlock or OpenSandbox
// networkPolicy form). An invalid document is rejected whole (400 with the line and
// reason) and changes nothing. Against `airlock up` the answer comes once the new
// version is enforced.
func (c *Client) SetPolicy(ctx context.Context, id string, doc json.RawMessage) (*PolicyInfo, error) {
	var p PolicyInfo
	if err := c.do(ctx, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/policy", doc, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SetNamedPolicy puts the sandbox under the library policy name (its own document or
// additions are dropped); later edits of that policy's file reach it at once.
func (c *Client) SetNamedPolicy(ctx context.Context, id, name string) (*PolicyInfo, error) {
	var p PolicyInfo
	u := "/sandboxes/" + url.PathEscape(id) + "/policy?name=" + url.QueryEscape(name)
	if err := c.do(ctx, http.MethodPut, u, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// PatchPolicy merges rules into the sandbox's policy (OpenSandbox PATCH semantics: they
// go first, replacing rules for the same targets); for a sandbox under a named policy
// they are its additions. rules is a JSON array of {action, target}.
func (c *Client) PatchPolicy(ctx context.Context, id string, rules json.RawMessage) (*PolicyInfo, error) {
	var p PolicyInfo
	if err := c.do(ctx, http.MethodPatch, "/sandboxes/"+url.PathEscape(id)+"/policy", rules, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// NamedPolicy is one policy of the server's library (GET /v1/policies).
type NamedPolicy struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	File    string `json:"file"`
	Removed bool   `json:"removed,omitempty"`
	// Sandboxes counts the sandboxes under it.
	Sandboxes int `json:"sandboxes"`
	// Policy (Airlock JSON form) and Source (the file) are set by NamedPolicy only.
	Policy json.RawMessage `json:"policy,omitempty"`
	Source string          `json:"source,omitempty"`
}

// NamedPolicies lists the server's library of named policies.
func (c *Client) NamedPolicies(ctx context.Context) ([]NamedPolicy, error) {
	var out []NamedPolicy
	if err := c.do(ctx, http.MethodGet, "/policies", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// NamedPolicy returns one policy of the library with its document and source.
func (c *Client) NamedPolicy(ctx context.Context, name string) (*NamedPolicy, error) {
	var p NamedPolicy
	if err := c.do(ctx, http.MethodGet, "/policies/"+url.PathEscape(name), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// AuditQuery selects audit records of one sandbox (GET /v1/sandboxes/{id}/audit).
type AuditQuery struct {
	// Since and Until bound the record time (since ≤ time < until); zero: unbounded.
	Since, Until time.Time
	// After continues after a record seq; Limit caps one page (server default 1000).
	After uint64
	Limit int
}

// AuditPage is one page of audit records; More says a next page exists (ask again with
// After = the last record's Seq).
type AuditPage struct {
	Records []record.Record `json:"records"`
	More    bool            `json:"more"`
}

// Audit returns one page of the sandbox's audit records.
func (c *Client) Audit(ctx context.Context, id string, q AuditQuery) (*AuditPage, error) {
	v := url.Values{}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var p AuditPage
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/audit?"+v.Encode(), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
