package egressd

import (
	"encoding/json"
	"net/http"

	"github.com/airlockdev/airlock/lifecycle/watch"
)

// StatusHandler serves GET watch.EnforcedPath+"{id}": 200 with watch.Enforced when the
// datapath enforces sandbox id, 404 {"code":"NOT_ENFORCED"} otherwise. It reveals no
// policy content, only whether and at which version a sandbox of this node is
// enforced; `airlock egressd` serves it on --metrics-listen.
func (d *Daemon) StatusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+watch.EnforcedPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		w.Header().Set("Content-Type", "application/json")
		v, ok := d.EnforcedVersion(id)
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": "NOT_ENFORCED", "message": "this node does not enforce sandbox " + id})
			return
		}
		_ = json.NewEncoder(w).Encode(watch.Enforced{SandboxID: id, PolicyVersion: v})
	})
	return mux
}
