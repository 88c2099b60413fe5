package lifecycle

import (
	"encoding/json"

	"github.com/airlockdev/airlock/policies"
)

// Pinned named policies. A snapshot of a sandbox under a named library policy keeps
// that policy's document as it was at capture (snapshotSource.NamedPolicy): the library
// keeps only each policy's last applied version (library.Stored), so the version the
// snapshot names could not be found again otherwise. A sandbox restored from it runs
// that document, not the library's current version: it is pinned (record.PinnedPolicy).
// Edits of the library's file do not reach a pinned sandbox; its additions (PATCH,
// DELETE of its own rules) combine with the pinned document as they would with the
// library's. The pin ends only through the policy API: PUT /sandboxes/{id}/policy?name=
// puts the sandbox under the library's current version of a named policy (the same
// name unpins), a PUT of a document gives it a policy of its own.

// policyPin is a sandbox's named policy held at one library version (record.PinnedPolicy).
type policyPin struct {
	// Version is the library version of the named policy that Policy is
	// (library.Policy.Version).
	Version uint64 `json:"version"`
	// SHA256 is the hex SHA-256 of the policy file at Version (library.Policy.SHA256).
	SHA256 string `json:"sha256,omitempty"`
	// SnapshotID is the snapshot the sandbox was restored from, which captured Policy.
	SnapshotID string `json:"snapshotId,omitempty"`
	// Policy is the named policy's document at Version (Airlock JSON form, as
	// policies.Parse reads it).
	Policy json.RawMessage `json:"policy"`
}

// clone returns a deep copy of p (nil for nil).
func (p *policyPin) clone() *policyPin {
	if p == nil {
		return nil
	}
	c := *p
	c.Policy = append(json.RawMessage(nil), p.Policy...)
	return &c
}

// PinnedPolicy is how the policy API reports a sandbox pinned to a version of its named
// policy (PolicyResponse.Pinned): the version it runs, the file's SHA-256 at that
// version, the snapshot that captured it and the library's current version of the
// policy (0 when the library no longer has it).
type PinnedPolicy struct {
	Version        uint64 `json:"version"`
	SHA256         string `json:"sha256,omitempty"`
	SnapshotID     string `json:"snapshotId,omitempty"`
	LibraryVersion uint64 `json:"libraryVersion"`
}

// pinned describes rec's pin for the policy API; nil when rec is not pinned. rec must
// not change during the call (the caller holds the registry lock).
func (l *policyLibrary) pinned(rec *record) *PinnedPolicy {
	p := rec.PinnedPolicy
	if p == nil || rec.PolicyName == "" {
		return nil
	}
	out := &PinnedPolicy{Version: p.Version, SHA256: p.SHA256, SnapshotID: p.SnapshotID}
	if l.lib != nil {
		if np, ok := l.lib.Get(rec.PolicyName); ok {
			out.LibraryVersion = np.Version
		}
	}
	return out
}

// base is the named policy rec runs under and its version: the pinned document when
// rec is pinned, else the library's current version; ok is false when there is
// neither (the library lost the policy, or a pinned document no longer parses).
func (l *policyLibrary) base(rec *record) (*policies.Policy, uint64, bool) {
	if p := rec.PinnedPolicy; p != nil {
		doc, err := policies.Parse(rec.PolicyName, p.Policy)
		if err != nil {
			l.log.Error("sandbox's pinned named policy does not parse", "sandbox_id", rec.ID,
				"policy", rec.PolicyName, "pinned_version", p.Version, "err", err)
			return nil, p.Version, false
		}
		return doc, p.Version, true
	}
	if l.lib == nil {
		return nil, 0, false
	}
	np, ok := l.lib.Get(rec.PolicyName)
	if !ok {
		return nil, 0, false
	}
	return np.Policy, np.Version, true
}

// capturedNamed returns what a snapshot of rec keeps of its named policy: the
// document and version rec runs (its pin, or the library's current version) and the
// file's SHA-256. doc is nil when rec has no named policy or the library lost it.
func (l *policyLibrary) capturedNamed(rec *record) (doc json.RawMessage, version uint64, sha string) {
	if rec.PolicyName == "" {
		return nil, 0, ""
	}
	if p := rec.PinnedPolicy; p != nil {
		return append(json.RawMessage(nil), p.Policy...), p.Version, p.SHA256
	}
	if l.lib == nil {
		return nil, 0, ""
	}
	np, ok := l.lib.Get(rec.PolicyName)
	if !ok {
		return nil, 0, ""
	}
	b, err := json.Marshal(np.Policy)
	if err != nil {
		return nil, np.Version, np.SHA256
	}
	return b, np.Version, np.SHA256
}

// restorePin is the pin of a sandbox restored from sn under the snapshot's own named
// policy; nil when the snapshot kept no document of it (taken before pins existed: the
// restore then runs the library's current version).
func restorePin(sn *snapshotRecord) *policyPin {
	if sn.Source.PolicyName == "" || len(sn.Source.NamedPolicy) == 0 {
		return nil
	}
	return &policyPin{Version: sn.Source.NamedVersion, SHA256: sn.Source.NamedSHA256, SnapshotID: sn.ID,
		Policy: append(json.RawMessage(nil), sn.Source.NamedPolicy...)}
}

// pinHasHTTP reports whether a pin's document has HTTP rules (false for nil or a
// document that does not parse).
func pinHasHTTP(p *policyPin) bool {
	if p == nil {
		return false
	}
	doc, err := policies.Parse("pinned policy", p.Policy)
	return err == nil && doc.HasHTTP()
}
