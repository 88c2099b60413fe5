package console

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// explainMatch is one rule whose target matches, in evaluation order.
type explainMatch struct {
	policies.Match
	// Decides marks the rule that decides; Shadowed a covering rule after it.
	Decides  bool `json:"decides"`
	Shadowed bool `json:"shadowed"`
}

// explainResponse is the body of GET /console/api/sandboxes/{id}/explain: what
// `airlock policy explain` prints, for the sandbox's stored policy (the operator default
// when it has none) compiled with the operator overlay.
type explainResponse struct {
	Target        string         `json:"target"`
	Kind          string         `json:"kind"` // "name" or "address"
	Class         string         `json:"class,omitempty"`
	Port          uint16         `json:"port"`
	Proto         string         `json:"proto"`
	PolicyVersion uint64         `json:"policyVersion"`
	DefaultPolicy bool           `json:"defaultPolicy"`
	Action        string         `json:"action"`
	WouldDeny     bool           `json:"wouldDeny"`
	Mode          string         `json:"mode"`
	Rule          string         `json:"rule"`
	Reason        string         `json:"reason"`
	Reach         string         `json:"reach,omitempty"`
	Matches       []explainMatch `json:"matches"`

	// Floor, for a decision of the platform floor, says so (Console.floorNote).
	Floor string `json:"floor,omitempty"`
}

// handleExplain answers GET /console/api/sandboxes/{id}/explain?target=&port=&proto=.
func (c *Console) handleExplain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	target := strings.TrimSpace(q.Get("target"))
	if target == "" || len(target) > 255 {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "target must be a name or an address")
		return
	}
	var port uint16
	if v := q.Get("port"); v != "" && v != "0" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "port must be from 1 to 65535 (or empty: any port)")
			return
		}
		port = uint16(n)
	}
	var proto policies.Protocol
	switch v := q.Get("proto"); v {
	case "", "any":
	case "tcp", "udp":
		proto = policies.Protocol(v)
	default:
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "proto must be tcp, udp or any")
		return
	}
	id := r.PathValue("id")
	var pi policyInfo
	if err := c.apiGet(r.Context(), "/v1/sandboxes/"+id+"/policy", &pi); err != nil {
		writeAPIError(w, err)
		return
	}
	raw, isDefault := []byte(pi.Policy), false
	if len(raw) == 0 || string(raw) == "null" {
		raw, isDefault = lifecycle.DefaultPolicy, true
	}
	d, err := policies.Load(id, raw, policies.CompileOptions{Overlay: c.cfg.Overlay, Version: pi.Version})
	if err != nil {
		c.log.Error("compiling a stored policy failed", "sandbox_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "the sandbox's stored policy does not compile")
		return
	}
	dec, matches := d.Explain(target, port, proto)
	resp := explainResponse{Target: target, Kind: "name", Port: port, Proto: string(proto), PolicyVersion: pi.Version,
		DefaultPolicy: isDefault, Action: string(dec.Action), WouldDeny: dec.WouldDeny, Mode: string(dec.Mode),
		Rule: dec.Rule, Reason: dec.Reason, Matches: []explainMatch{}}
	resp.Floor = c.floorNote(dec)
	if resp.Proto == "" {
		resp.Proto = "any"
	}
	if a, err := netip.ParseAddr(target); err == nil {
		resp.Kind, resp.Class = "address", string(policies.Classify(a.WithZone("")))
	}
	if port == 0 && proto == "" && resp.Kind == "name" && dec.Action == policies.Allow {
		resp.Reach = dec.Ports.String()
	}
	decided := false
	for _, m := range matches {
		em := explainMatch{Match: m}
		switch {
		case m.Rule == dec.Rule && !decided:
			em.Decides, decided = true, true
		case m.Covers && decided:
			em.Shadowed = true
		}
		resp.Matches = append(resp.Matches, em)
	}
	opensandbox.WriteJSON(w, http.StatusOK, resp)
}
