package console

import (
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// floorResponse is the body of GET /console/api/floor: the platform floor of the
// operator overlay the console compiles policies with (policies.Overlay.Floor), the
// always-deny entries first (no policy rule overrides them), then the special-address
// classes (Overridable: an explicit IP/CIDR allow rule reaches them).
type floorResponse struct {
	Entries []policies.FloorEntry `json:"entries"`
}

// handleFloor answers GET /console/api/floor.
func (c *Console) handleFloor(w http.ResponseWriter, _ *http.Request) {
	opensandbox.WriteJSON(w, http.StatusOK, floorResponse{Entries: c.cfg.Overlay.Floor()})
}

// floorNote is the explain view's word on a decision by the floor: which entry denied
// it and that no rule can change that, or that a special address needs an explicit
// IP/CIDR rule; "" for a decision by a rule or the default.
func (c *Console) floorNote(dec policies.Decision) string {
	switch {
	case dec.InFloor():
		for _, e := range c.cfg.Overlay.Floor() {
			if e.Rule == dec.Rule {
				return "the platform floor denies this (" + e.Target + ", " + e.Source + ": " + e.Note + "), not a rule of the policy; no policy rule can allow it"
			}
		}
		return "the platform floor denies this, not a rule of the policy; no policy rule can allow it"
	case dec.Rule == "guard":
		return "a special address: the floor denies it unless an explicit IP/CIDR allow rule of the policy names it"
	}
	return ""
}
