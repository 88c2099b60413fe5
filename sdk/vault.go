package sdk

import (
	"context"
	"net/http"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/opensandbox"
)

// Vault is the Credential Vault of one sandbox (OpenSandbox egress API, egress-api.yaml
// /credential-vault), reached through the endpoint of port 18080 with its headers. The
// sandbox must have been created with CreateRequest.CredentialProxy. Values are
// write-only: every answer is sanitized (names, types, revisions).
type Vault struct{ x *Execd }

// Vault returns the Credential Vault client of sandbox id.
func (c *Client) Vault(ctx context.Context, id string) (*Vault, error) {
	x, err := c.portClient(ctx, id, opensandbox.EgressAPIPort)
	if err != nil {
		return nil, err
	}
	return &Vault{x: x}, nil
}

// Create creates the vault (revision 1); 409 when one exists, 412 when a binding's
// destination is not allowed by the sandbox's networkPolicy.
func (v *Vault) Create(ctx context.Context, r vault.CreateRequest) (*vault.State, error) {
	var st vault.State
	return &st, v.x.json(ctx, http.MethodPost, "/credential-vault", r, &st)
}

// Get returns the sanitized state; 404 without a vault.
func (v *Vault) Get(ctx context.Context) (*vault.State, error) {
	var st vault.State
	return &st, v.x.json(ctx, http.MethodGet, "/credential-vault", nil, &st)
}

// Patch applies a mutation atomically (409 when ExpectedRevision is stale).
func (v *Vault) Patch(ctx context.Context, m vault.MutationRequest) (*vault.State, error) {
	var st vault.State
	return &st, v.x.json(ctx, http.MethodPatch, "/credential-vault", m, &st)
}

// Delete removes the vault: nothing is injected afterwards.
func (v *Vault) Delete(ctx context.Context) error {
	return v.x.json(ctx, http.MethodDelete, "/credential-vault", nil, nil)
}
