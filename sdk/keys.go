package sdk

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlockdev/airlock/principal"
)

// Key management (Airlock extension, /v1/keys): every API key is a principal with an
// id, a name and a role (principal.Admin, Operator, Auditor, User). Only an admin's
// key may create, list, revoke or rotate keys; any key may ask who it is (Self).
// Errors are *APIError: 403 FORBIDDEN for a role that may not, 404 KEY_NOT_FOUND,
// 409 INVALID_STATE for the server's configured key.

// Self returns the principal of the client's key (GET /v1/keys/self).
func (c *Client) Self(ctx context.Context) (*principal.Principal, error) {
	var p principal.Principal
	if err := c.do(ctx, http.MethodGet, "/keys/self", nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Keys lists every principal, the server's configured admin first (GET /v1/keys); no
// key is in the answer.
func (c *Client) Keys(ctx context.Context) ([]principal.Info, error) {
	var out struct {
		Items []principal.Info `json:"items"`
	}
	if err := c.do(ctx, http.MethodGet, "/keys", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// CreateKey makes a principal named name with role and returns it with its key, which
// the server shows only this once (POST /v1/keys).
func (c *Client) CreateKey(ctx context.Context, name string, role principal.Role) (*principal.Created, error) {
	var out principal.Created
	if err := c.do(ctx, http.MethodPost, "/keys", principal.CreateRequest{Name: name, Role: role}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeKey deletes principal id's key; it stops working at once (DELETE /v1/keys/{id}).
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, nil)
}

// RotateKey gives principal id a new key, returned this once; the old key stops
// working at once (POST /v1/keys/{id}/rotate).
func (c *Client) RotateKey(ctx context.Context, id string) (*principal.Created, error) {
	var out principal.Created
	if err := c.do(ctx, http.MethodPost, "/keys/"+url.PathEscape(id)+"/rotate", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
