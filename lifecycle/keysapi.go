package lifecycle

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// keysAPI serves the API key routes (Airlock extension, beside /policies; served at
// /keys and /v1/keys):
//
//	GET    /keys             200 {"items":[principal.Info...]} (admin)
//	POST   /keys             201 principal.Created: the key, shown this once (admin)
//	DELETE /keys/{id}        204: the key stops working at once (admin)
//	POST   /keys/{id}/rotate 200 principal.Created: a new key; the old one stops (admin)
//	GET    /keys/self        200 principal.Principal: who the caller is (any role)
//
// Every change and refusal is logged with the acting principal and the request id
// (never a key); its control-plane audit record (source control, op key.*) is made by
// Server.Handler for every route alike (control.go).
type keysAPI struct {
	keys *principal.Keyring
	log  *slog.Logger
}

func (a *keysAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		opensandbox.WriteJSON(w, http.StatusOK, map[string]any{"items": a.keys.List()})
	})
	m.HandleFunc("GET /keys/self", func(w http.ResponseWriter, r *http.Request) {
		opensandbox.WriteJSON(w, http.StatusOK, principalOf(r))
	})
	m.HandleFunc("POST /keys", a.handleCreate)
	m.HandleFunc("DELETE /keys/{id}", a.handleRevoke)
	m.HandleFunc("POST /keys/{id}/rotate", a.handleRotate)
}

func (a *keysAPI) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req principal.CreateRequest
	if err := decode(r, &req); err != nil {
		a.fail(w, r, "create", "", err)
		return
	}
	c, err := a.keys.Create(req)
	if err != nil {
		a.fail(w, r, "create", "", err)
		return
	}
	a.record(r, "create", c.ID, "allow", "api key created for "+c.Name+" ("+string(c.Role)+")")
	w.Header().Set("Location", "/v1/keys/"+c.ID)
	opensandbox.WriteJSON(w, http.StatusCreated, c)
}

func (a *keysAPI) handleRevoke(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.keys.Revoke(id); err != nil {
		a.fail(w, r, "revoke", id, err)
		return
	}
	a.record(r, "revoke", id, "allow", "api key revoked")
	w.WriteHeader(http.StatusNoContent)
}

func (a *keysAPI) handleRotate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c, err := a.keys.Rotate(id)
	if err != nil {
		a.fail(w, r, "rotate", id, err)
		return
	}
	a.record(r, "rotate", id, "allow", "api key rotated")
	opensandbox.WriteJSON(w, http.StatusOK, c)
}

// fail maps the keyring's errors to the API's (400, 404, 409) and records the refusal.
func (a *keysAPI) fail(w http.ResponseWriter, r *http.Request, op, id string, err error) {
	switch {
	case errors.Is(err, principal.ErrInvalid):
		err = fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	case errors.Is(err, principal.ErrNotFound):
		err = fmt.Errorf("%w: %v", ErrKeyNotFound, err)
	case errors.Is(err, principal.ErrConfigured):
		err = fmt.Errorf("%w: %v (change apiKey in airlock.yaml or the api-key file, then restart)", ErrInvalidState, err)
	}
	if _, body, internal := httpError(err); !internal {
		a.record(r, op, id, "deny", body.Message)
	}
	fail(a.log, w, r, err)
}

// record logs a key management outcome: who (principal), what (op, the target
// principal id), the outcome; never a key.
func (a *keysAPI) record(r *http.Request, op, target, action, reason string) {
	a.log.Info("api key management", "op", op, "action", action, "principal_id", principalOf(r).ID,
		"target_principal_id", target, "request_id", r.Header.Get(opensandbox.HeaderRequestID), "reason", reason)
}
