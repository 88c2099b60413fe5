package sdk

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// PolicyInfo is a sandbox's stored egress policy as Airlock's policy API reports it
// (GET and PUT /v1/sandboxes/{id}/policy, lifecycle/README.md).
type PolicyInfo struct {
	SandboxID string `json:"sandboxId"`
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
