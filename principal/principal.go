// Package principal is who acts on Airlock's API: a principal (an id, a name and a
// role) authenticated by one of many API keys, and the request-context accessor every
// component uses to learn it (lifecycle puts the authenticated principal there; the
// audit, the console and others read it with FromContext).
//
// Keys are stored hashed (SHA-256 of a 256-bit random key, so a hash cannot be
// reversed by search) and shown once, at creation or rotation (Keyring). Roles decide
// what a principal may do (Role.Allows); lifecycle maps its routes to Actions.
//
// Standard library only, so the SDK and the data plane may import it.
package principal

import (
	"context"
	"fmt"
)

// Role is what a principal may do: one of Admin, Operator, Auditor, User.
type Role string

// The roles, most powerful first.
const (
	// Admin may do everything, including key management.
	Admin Role = "admin"
	// Operator manages sandboxes and policies (every sandbox), not keys.
	Operator Role = "operator"
	// Auditor reads sandboxes, policies, audit records and diagnostics; changes nothing
	// and reaches no sandbox (no endpoints, no server proxy).
	Auditor Role = "auditor"
	// User creates sandboxes and uses its own only (another principal's sandbox is
	// unknown to it: 404 on every route).
	User Role = "user"
)

// Roles lists every role, most powerful first.
var Roles = []Role{Admin, Operator, Auditor, User}

// ParseRole returns the role named s (exact, lower case) or an error naming the roles.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !r.Valid() {
		return "", fmt.Errorf("role %q: want admin, operator, auditor or user", s)
	}
	return r, nil
}

// Valid reports whether r is one of the four roles.
func (r Role) Valid() bool {
	switch r {
	case Admin, Operator, Auditor, User:
		return true
	}
	return false
}

// String returns the role's name.
func (r Role) String() string { return string(r) }

// Action is a class of API request a role may or may not make.
type Action int

// The action classes of the API (lifecycle maps each route to one).
const (
	// ReadSandbox: get and list sandboxes, their policy, diagnostics and audit.
	ReadSandbox Action = iota
	// WriteSandbox: create, delete, pause, resume, renew, patch metadata, revoke signed
	// URLs, change a sandbox's policy.
	WriteSandbox
	// UseSandbox: reach into a sandbox: its endpoints (they carry its access token),
	// the server proxy (execd, the egress API, its ports).
	UseSandbox
	// ReadAudit: the audit log and metrics beyond one's own sandboxes.
	ReadAudit
	// ReadPolicies: the policy library (it lists the sandboxes using each policy, so
	// users may not read it).
	ReadPolicies
	// ManageKeys: create, list, revoke and rotate API keys.
	ManageKeys
	// Internal: the data plane's watch stream.
	Internal
)

var actionNames = [...]string{"read sandboxes", "change sandboxes", "use sandboxes", "read the audit log", "read policies", "manage API keys", "follow the watch stream"}

// String names the action for error messages ("manage API keys").
func (a Action) String() string {
	if a < 0 || int(a) >= len(actionNames) {
		return fmt.Sprintf("action %d", int(a))
	}
	return actionNames[a]
}

// Allows reports whether r may perform a. For User it says whether the action is open
// to users at all: a user's sandbox actions are further limited to its own sandboxes
// (OwnsAll), which the caller checks.
func (r Role) Allows(a Action) bool {
	switch r {
	case Admin:
		return true
	case Operator:
		return a != ManageKeys && a != Internal
	case Auditor:
		return a == ReadSandbox || a == ReadAudit || a == ReadPolicies
	case User:
		return a == ReadSandbox || a == WriteSandbox || a == UseSandbox
	}
	return false
}

// OwnsAll reports whether r sees every sandbox (all roles but User).
func (r Role) OwnsAll() bool { return r.Valid() && r != User }

// Principal is who made a request: ID is stable (the key's id; "admin" for the
// configured API key, "anonymous" when the API has no authentication), Name is for
// people, Role decides what it may do.
type Principal struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// Well-known principal ids.
const (
	// ConfiguredAdminID is the principal of the configured API key (airlock up's
	// api-key file or apiKey in airlock.yaml): the first admin.
	ConfiguredAdminID = "admin"
	// AnonymousID is the principal of requests to an API without authentication
	// (--no-auth): an admin.
	AnonymousID = "anonymous"
)

type ctxKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal ctx carries (lifecycle sets it on every
// authenticated request); ok is false when there is none (unauthenticated routes:
// /health, presigned downloads, the server proxy admitted by a sandbox token).
func FromContext(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// IDFromContext is the id of the principal ctx carries, "" when none (for audit
// records).
func IDFromContext(ctx context.Context) string {
	p, _ := FromContext(ctx)
	return p.ID
}
