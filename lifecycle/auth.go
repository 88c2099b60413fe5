package lifecycle

import (
	"fmt"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// routeActions maps each route pattern of the mux to the action class it needs
// (principal.Role.Allows). A pattern missing here (one another component mounted with
// Handle) needs an admin or operator; the fallback "/" (404) and method mismatches
// ("" pattern) need only a valid key. Routes with a sandbox {id} are further limited,
// for users, to their own sandboxes (ownerGate).
var routeActions = map[string]principal.Action{
	"POST /metrics/events":                    principal.ReadSandbox,
	"POST /sandboxes":                         principal.WriteSandbox,
	"GET /sandboxes":                          principal.ReadSandbox,
	"GET /sandboxes/{id}":                     principal.ReadSandbox,
	"DELETE /sandboxes/{id}":                  principal.WriteSandbox,
	"PATCH /sandboxes/{id}/metadata":          principal.WriteSandbox,
	"POST /sandboxes/{id}/pause":              principal.WriteSandbox,
	"POST /sandboxes/{id}/resume":             principal.WriteSandbox,
	"POST /sandboxes/{id}/renew-expiration":   principal.WriteSandbox,
	"GET /sandboxes/{id}/endpoints/{port}":    principal.UseSandbox,
	"POST /sandboxes/{id}/signed-urls/revoke": principal.WriteSandbox,
	"GET /sandboxes/{id}/policy":              principal.ReadSandbox,
	"PUT /sandboxes/{id}/policy":              principal.WriteSandbox,
	"PATCH /sandboxes/{id}/policy":            principal.WriteSandbox,
	"DELETE /sandboxes/{id}/policy":           principal.WriteSandbox,
	"GET /sandboxes/{id}/policy/proposal":     principal.ReadSandbox,
	"POST /sandboxes/{id}/policy/proposal":    principal.WriteSandbox,
	"GET /sandboxes/{id}/audit":               principal.ReadSandbox,
	"GET /sandboxes/{id}/diagnostics/logs":    principal.ReadSandbox,
	"GET /sandboxes/{id}/diagnostics/events":  principal.ReadSandbox,
	"GET /policies":                           principal.ReadPolicies,
	"GET /policies/{name}":                    principal.ReadPolicies,
	"GET /snapshots":                          principal.ReadSandbox,
	"GET /snapshots/{sid}":                    principal.ReadSandbox,
	"DELETE /snapshots/{sid}":                 principal.WriteSandbox,
	"POST /sandboxes/{id}/snapshots":          principal.WriteSandbox,
	"GET /internal/v1/watch":                  principal.Internal,
	"GET /metrics":                            principal.ReadAudit,
	"GET /keys":                               principal.ManageKeys,
	"POST /keys":                              principal.ManageKeys,
	"DELETE /keys/{id}":                       principal.ManageKeys,
	"POST /keys/{id}/rotate":                  principal.ManageKeys,
}

// openRoutes need only a valid key, whatever its role.
var openRoutes = map[string]bool{"": true, "/": true, "GET /keys/self": true}

// authenticate returns the principal of r's OPEN-SANDBOX-API-KEY. Without
// authentication configured (no API key, --no-auth) a request whose key is unknown is
// the admin principal.AnonymousID.
func (s *Server) authenticate(r *http.Request) (principal.Principal, bool) {
	if p, ok := s.keys.Authenticate(r.Header.Get(opensandbox.HeaderAPIKey)); ok {
		return p, true
	}
	if !s.auth {
		return principal.Principal{ID: principal.AnonymousID, Name: "anonymous (no authentication)", Role: principal.Admin}, true
	}
	return principal.Principal{}, false
}

// authorize decides whether p may make r: the role must allow the route's action
// (403 FORBIDDEN naming the role and the action otherwise), and a user may reach only
// its own sandboxes (404 SANDBOX_NOT_FOUND for any other, as for one that does not
// exist, so a user cannot learn other sandboxes' ids).
func (s *Server) authorize(r *http.Request, p principal.Principal) error {
	_, pat := s.mux.Handler(r)
	if !openRoutes[pat] {
		act, known := routeActions[pat]
		allowed := known && p.Role.Allows(act) || !known && (p.Role == principal.Admin || p.Role == principal.Operator)
		if !allowed {
			what := "use this route"
			if known {
				what = act.String()
			}
			return fmt.Errorf("%w: the %s role of %s may not %s", ErrForbidden, p.Role, p.ID, what)
		}
	}
	if id := sandboxIDOf(r.URL.Path); id != "" && !s.mayReach(p, id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}

// mayReach reports whether p may see sandbox id: every role but user sees every
// sandbox; a user sees the sandboxes it created. A sandbox that does not exist is
// reachable (the route answers 404 itself).
func (s *Server) mayReach(p principal.Principal, id string) bool {
	if p.Role.OwnsAll() {
		return true
	}
	owner, found := "", false
	found = s.peek(id, func(rec *record) { owner = rec.Owner })
	return !found || owner == p.ID
}

// principalOf returns the principal Handler put in r's context (the zero principal
// when none, for routes without authentication).
func principalOf(r *http.Request) principal.Principal {
	p, _ := principal.FromContext(r.Context())
	return p
}
