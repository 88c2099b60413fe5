package egressd

import (
	"net/http"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// StatusHandler serves GET watch.EnforcedPath+"{id}": 200 with watch.Enforced when the
// datapath enforces sandbox id, 404 {"code":"NOT_ENFORCED"} otherwise. It reveals no
// policy content, only whether and at which version a sandbox of this node is
// enforced; `airlock egressd` serves it on --metrics-listen.
func (d *Daemon) StatusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+watch.EnforcedPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		v, ok := d.EnforcedVersion(id)
		if !ok {
			opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_ENFORCED", Message: "this node does not enforce sandbox " + id})
			return
		}
		opensandbox.WriteJSON(w, http.StatusOK, watch.Enforced{SandboxID: id, PolicyVersion: v})
	})
	return mux
}
