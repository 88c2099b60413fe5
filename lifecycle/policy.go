package lifecycle

import (
	"encoding/json"
	"fmt"
)

// Policy returns the sandbox's egress policy document as stored (raw JSON, empty when
// the operator default applies) and its version. The egress policy API uses it.
func (s *Server) Policy(id string) (json.RawMessage, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	doc, v := s.lib.effective(e.rec)
	return append(json.RawMessage(nil), doc...), v, nil
}

// SetPolicy replaces the sandbox's egress policy document (validated by the caller:
// package policies owns the format), persists it, bumps the version (unless the
// document is unchanged) and publishes it to the watch. It returns the version.
func (s *Server) SetPolicy(id string, doc json.RawMessage) (uint64, error) {
	return s.UpdatePolicy(id, func(json.RawMessage) (json.RawMessage, error) { return doc, nil })
}

// UpdatePolicy replaces the sandbox's policy with fn(current document, current version)
// atomically: no other change can land between the read and the write (concurrent
// PATCHes never lose rules). fn returning an error changes nothing; returning the
// current document unchanged keeps the version. It returns the resulting (effective)
// version. For a sandbox under a named policy fn gets and returns its additions.
func (s *Server) UpdatePolicy(id string, fn func(cur json.RawMessage) (json.RawMessage, error)) (uint64, error) {
	return s.updatePolicy(id, false, fn)
}

// updatePolicy is UpdatePolicy; replace detaches a sandbox from its named policy: the
// result of fn becomes its whole policy.
func (s *Server) updatePolicy(id string, replace bool, fn func(cur json.RawMessage) (json.RawMessage, error)) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	doc, err := fn(append(json.RawMessage(nil), rec.Policy...))
	if err != nil {
		return 0, err
	}
	_, effV := s.lib.effective(rec)
	detach := replace && rec.PolicyName != ""
	if string(doc) == string(rec.Policy) && !detach {
		return effV, nil
	}
	old, oldV, oldName, oldPin, oldEvents := rec.Policy, rec.PolicyVersion, rec.PolicyName, rec.PinnedPolicy, rec.Events
	rec.Policy = append(json.RawMessage(nil), doc...)
	if detach { // a policy of its own: no named policy, pinned or not
		rec.PolicyName, rec.PinnedPolicy, rec.PolicyVersion = "", nil, effV+1
	} else {
		rec.PolicyVersion++
	}
	s.policyEventLocked(rec, "policy API")
	if err := s.commitLocked(rec); err != nil {
		rec.Policy, rec.PolicyVersion, rec.PolicyName, rec.PinnedPolicy, rec.Events = old, oldV, oldName, oldPin, oldEvents
		return 0, err
	}
	_, v := s.lib.effective(rec)
	return v, nil
}

// NamedPolicyChanged republishes every sandbox under policy name (its library version
// changed), so the data plane enforces the new version, and returns how many. The
// library's OnEvent calls it. A sandbox pinned to a version of name (policypin.go)
// keeps it: it only gets a diagnostic event. It performs no I/O: records are
// unchanged, only their effective policy is.
func (s *Server) NamedPolicyChanged(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.sbx {
		if e.rec.PolicyName == name && !e.rec.Status.State.Terminal() {
			if p := e.rec.PinnedPolicy; p != nil {
				addEventLocked(e.rec, EventNetwork, EventNormal, "PolicyPinned", fmt.Sprintf(
					"named policy %s changed in the library; the sandbox stays pinned at its version %d (snapshot %s) until its policy is set through the API",
					name, p.Version, p.SnapshotID))
				continue
			}
			// Kept in memory; persisted with the record's next write.
			s.policyEventLocked(e.rec, "named policy "+name+" changed in the library")
			s.hub.Put(s.watchView(e.rec))
			n++
		}
	}
	return n
}

// SetNamedPolicy puts sandbox id under library policy name at the library's current
// version (following its later changes), dropping its own document or additions and
// any pin (policypin.go: the same name unpins), and returns the effective version.
func (s *Server) SetNamedPolicy(id, name string) (uint64, error) {
	np, err := s.lib.named(name, false)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	if rec.PolicyName == name && len(rec.Policy) == 0 && rec.PinnedPolicy == nil {
		_, v := s.lib.effective(rec)
		return v, nil
	}
	_, oldV := s.lib.effective(rec)
	oldName, oldDoc, oldAdd, oldPin, oldEvents := rec.PolicyName, rec.Policy, rec.PolicyVersion, rec.PinnedPolicy, rec.Events
	rec.PolicyName, rec.Policy, rec.PinnedPolicy = name, nil, nil
	rec.PolicyVersion = 1
	if oldV+1 > np.Version {
		rec.PolicyVersion = oldV + 1 - np.Version
	}
	why := "put under named policy " + name
	if oldPin != nil && oldName == name {
		why = "unpinned from version " + fmt.Sprint(oldPin.Version) + ": follows the library's current version of " + name
	}
	s.policyEventLocked(rec, why)
	if err := s.commitLocked(rec); err != nil {
		rec.PolicyName, rec.Policy, rec.PolicyVersion, rec.PinnedPolicy, rec.Events = oldName, oldDoc, oldAdd, oldPin, oldEvents
		return 0, err
	}
	_, v := s.lib.effective(rec)
	return v, nil
}
