package lifecycle

import (
	"fmt"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// Event is one diagnostic event of a sandbox: what lifecycle itself did or saw (kept in
// the sandbox's record, a ring of eventRingLen) or what the runtime reports (Docker
// engine events and the container's state, Kubernetes Events and the pod's status).
// It is rendered as one line of diagnostic text (GET /sandboxes/{id}/diagnostics/events):
// "<RFC 3339 time> <source> <type> <reason> <message>", which is display text, not a
// stable schema (docs/spec/diagnostic-api.yml).
type Event struct {
	Time time.Time `json:"time"`
	// Source is EventLifecycle, EventNetwork or EventRuntime.
	Source string `json:"source"`
	// Type is EventNormal or EventWarning (the Kubernetes Event types).
	Type string `json:"type"`
	// Reason is one CamelCase word: Created, Running, PolicyApplied, Exited, …
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// Event sources, which are also the event scopes of the diagnostics API.
const (
	// EventLifecycle: lifecycle's own records: create, state transitions, release.
	EventLifecycle = "lifecycle"
	// EventNetwork: the sandbox's egress: policy versions stored and confirmed
	// enforced by the data plane (egressd), the datapath attached before release.
	EventNetwork = "network"
	// EventRuntime: what the runtime reports (image pull, container create, start, OOM
	// kill, exit code; Kubernetes Events).
	EventRuntime = "runtime"
)

// Event types.
const (
	EventNormal  = "Normal"
	EventWarning = "Warning"
)

// eventRingLen bounds the events a record keeps (the oldest go first);
// eventMessageMax bounds one message in bytes. A full ring is about 20 KiB of the
// record's JSON.
const (
	eventRingLen    = 64
	eventMessageMax = 256
)

// line renders e as one line of diagnostic text, without the newline.
func (e Event) line() string {
	msg := strings.Join(strings.Fields(e.Message), " ")
	out := e.Time.UTC().Format(time.RFC3339Nano) + " " + e.Source + " " + e.Type + " " + e.Reason
	if msg != "" {
		out += " " + msg
	}
	return out
}

// addEventLocked appends an event to rec's ring (time now) without persisting it: the
// caller commits the record (or the next commit does). s.mu is held, or rec is not
// shared yet.
func addEventLocked(rec *record, source, typ, reason, msg string) {
	if len(msg) > eventMessageMax {
		msg = msg[:eventMessageMax-3] + "..."
	}
	rec.Events = append(rec.Events, Event{Time: time.Now().UTC(), Source: source, Type: typ, Reason: reason, Message: msg})
	if n := len(rec.Events); n > eventRingLen {
		rec.Events = append([]Event(nil), rec.Events[n-eventRingLen:]...)
	}
}

// statusEventLocked records rec's move to state as a lifecycle event; s.mu is held.
func statusEventLocked(rec *record, state opensandbox.State, reason, msg string) {
	typ := EventNormal
	if state == opensandbox.Failed || reason == "container_vanished" || reason == "runtime_error" {
		typ = EventWarning
	}
	text := "state " + string(state)
	if reason != "" {
		text += " (" + reason + ")"
	}
	if msg != "" {
		text += ": " + msg
	}
	addEventLocked(rec, EventLifecycle, typ, string(state), text)
}

// policyEventLocked records that rec's effective policy is now version v (stored; the
// data plane follows through the watch); s.mu is held.
func (s *Server) policyEventLocked(rec *record, why string) {
	_, v := s.lib.effective(rec)
	msg := fmt.Sprintf("policy version %d stored (%s)", v, why)
	switch {
	case rec.PolicyName != "":
		msg += "; named policy " + rec.PolicyName
		if p := rec.PinnedPolicy; p != nil {
			msg += fmt.Sprintf(" pinned at its version %d (snapshot %s)", p.Version, p.SnapshotID)
		}
	case len(rec.Policy) == 0:
		msg = fmt.Sprintf("no egress policy of its own: the operator's default applies (%s)", why)
	}
	addEventLocked(rec, EventNetwork, EventNormal, "PolicyApplied", msg)
}

// recordEvent appends an event to sandbox id's ring and persists it; an unknown
// sandbox is ignored and a failed write is logged.
func (s *Server) recordEvent(id, source, typ, reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return
	}
	addEventLocked(e.rec, source, typ, reason, msg)
	if err := putRecord(s.store, e.rec); err != nil {
		s.log.Error("persisting a sandbox event failed", "sandbox_id", id, "err", err)
	}
}

// events returns a copy of sandbox id's recorded events; ErrNotFound when unknown.
func (s *Server) events(id string) ([]Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return append([]Event(nil), e.rec.Events...), nil
}

// noteEgressAttached records, in memory until the next write of the record, that the
// ready gate opened: the data plane (egressd) enforces the new sandbox's policy.
func (s *Server) noteEgressAttached(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.sbx[id]; ok {
		_, v := s.lib.effective(e.rec)
		addEventLocked(e.rec, EventNetwork, EventNormal, "EgressAttached",
			fmt.Sprintf("the data plane enforces the sandbox's egress (policy version %d) before its entrypoint runs", v))
	}
}

// noteReleased records, in memory until the next write of the record, that execd
// started the user's entrypoint.
func (s *Server) noteReleased(id string) {
	msg := "execd started the entrypoint"
	if s.cfg.ReadyGate == nil {
		msg += " (no data-plane gate configured: egress enforcement was not confirmed)"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.sbx[id]; ok {
		addEventLocked(e.rec, EventLifecycle, EventNormal, "Released", msg)
	}
}
