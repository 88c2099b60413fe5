package egressd

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// maxCABody bounds the body of a CA import.
const maxCABody = 64 << 10

// VaultHandler serves the Credential Vault's node API (watch.VaultPath) for store,
// the daemon's vault, to callers that send apiKey in opensandbox.HeaderAPIKey (401
// otherwise; lifecycle replicas hold the same key):
//
//   - PUT <id>/ca: store.ImportCA of the body's watch.VaultCA (204; 400 for a bad CA);
//   - <id>/credential-vault[/…], any method: store.ServeAPI, a binding checked against
//     the sandbox's policy as this node enforces it (policies.CoversBinding);
//   - DELETE <id>: store.Delete (204); also a snapshot's copy (<id> a snapshot id);
//   - POST copy: store.CopyVault of the body's watch.VaultCopy (204, no body): a
//     sandbox's sealed credentials and bindings to a snapshot's copy kept on this node
//     (capture), or a snapshot's copy to a sandbox (restore); 400 unless one side is a
//     sandbox and the other a snapshot id (watch.IsSnapshotID), 404 when that sandbox
//     is not one this node runs. Values stay sealed here: nothing of them is answered,
//     logged or audited (the audit's Change names the bindings only).
//
// The first two answer 404 for a sandbox this node does not run. `airlock egressd
// --vault-dir` serves it on --metrics-listen.
func (d *Daemon) VaultHandler(store *vault.Store, apiKey string) http.Handler {
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc { return requireAPIKey(apiKey, h) }
	known := func(w http.ResponseWriter, id string) (json.RawMessage, bool) {
		d.mu.RLock()
		sb := d.byID[id]
		d.mu.RUnlock()
		if sb == nil {
			opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "this node does not run sandbox " + id})
			return nil, false
		}
		return sb.view.Policy, true
	}
	mux.HandleFunc("PUT "+watch.VaultPath+"{id}/ca", auth(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if _, ok := known(w, id); !ok {
			return
		}
		var ca watch.VaultCA
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCABody)).Decode(&ca); err != nil {
			opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST", Message: "body: " + err.Error()})
			return
		}
		if err := store.ImportCA(id, ca.Cert, ca.Key); err != nil {
			opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST", Message: err.Error()})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	serve := auth(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		raw, ok := known(w, id)
		if !ok {
			return
		}
		rest := "/credential-vault"
		if sub := r.PathValue("rest"); sub != "" {
			rest += "/" + sub
		}
		store.ServeAPI(w, r, id, rest, func(host string, port uint16) error {
			var p *policies.Policy
			if len(raw) > 0 && string(raw) != "null" {
				var err error
				if p, err = policies.Parse(id, raw); err != nil {
					return err
				}
			}
			return policies.CoversBinding(p, host, port)
		})
	})
	mux.HandleFunc(watch.VaultPath+"{id}/credential-vault", serve)
	mux.HandleFunc(watch.VaultPath+"{id}/credential-vault/{rest...}", serve)
	mux.HandleFunc("POST "+watch.VaultPath+"copy", auth(func(w http.ResponseWriter, r *http.Request) {
		var req watch.VaultCopy
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCABody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST", Message: "body: " + err.Error()})
			return
		}
		sbx := req.From
		switch {
		case watch.IsSnapshotID(req.To) && !watch.IsSnapshotID(req.From):
		case watch.IsSnapshotID(req.From) && !watch.IsSnapshotID(req.To):
			sbx = req.To
		default:
			opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST",
				Message: "from and to must be a sandbox this node runs and a snapshot id (snap-[a-z0-9]+), one each"})
			return
		}
		if _, ok := known(w, sbx); !ok {
			return
		}
		if err := store.CopyVault(req.From, req.To); err != nil {
			d.log.Error("copying a credential vault failed", "from", req.From, "to", req.To, "err", err)
			opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL_ERROR", Message: "internal error; see egressd's log"})
			return
		}
		d.log.Info("credential vault copied", "from", req.From, "to", req.To)
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("DELETE "+watch.VaultPath+"{id}", auth(func(w http.ResponseWriter, r *http.Request) {
		if err := store.Delete(r.PathValue("id")); err != nil {
			d.log.Error("deleting a sandbox's credential vault failed", "sandbox_id", r.PathValue("id"), "err", err)
			opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL_ERROR", Message: "internal error; see egressd's log"})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	return mux
}

// requireAPIKey passes to h only a request carrying apiKey in OPEN-SANDBOX-API-KEY
// (compared in constant time); others get 401 UNAUTHORIZED, and every request does
// when apiKey is empty. The node APIs lifecycle calls (vault, snapshots) use it.
func requireAPIKey(apiKey string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(opensandbox.HeaderAPIKey)
		if apiKey == "" || subtle.ConstantTimeCompare([]byte(got), []byte(apiKey)) != 1 {
			opensandbox.WriteError(w, http.StatusUnauthorized, opensandbox.ErrorBody{Code: "UNAUTHORIZED", Message: "the API key is required"})
			return
		}
		h(w, r)
	}
}
