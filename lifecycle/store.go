package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/airlockdev/airlock/policies/library"
)

// StateStore persists the registry: one JSON document per sandbox (its record), the
// instance id that marks this server's containers or pods, and the policy library's
// versions. lifecycle/boltstore (bbolt) serves a single host; lifecycle/kubestore a
// cluster, where it is also a SharedStore. Every write is durable when it returns.
type StateStore interface {
	// InstanceID returns the id that marks this server's containers or pods, creating
	// it on first use; it is the same on every call and across restarts.
	InstanceID() (string, error)
	// PutSandbox writes the document of sandbox id, replacing any previous one.
	PutSandbox(id string, doc []byte) error
	// DeleteSandbox removes it; a missing one is not an error.
	DeleteSandbox(id string) error
	// Sandboxes returns every document by sandbox id.
	Sandboxes() (map[string][]byte, error)
	library.Store
}

// SharedStore is a StateStore that several lifecycle replicas use at once
// (Kubernetes). Each replica keeps its registry in memory and follows the others'
// writes; the loops that drive the runtime on their own (expiry, resync, orphans) run
// in the one replica that leads.
type SharedStore interface {
	StateStore
	// Follow calls apply, one call at a time, for every sandbox document another
	// replica writes (doc nil: deleted) until ctx ends. It returns once the store's
	// cache is in sync, so Sandboxes afterwards sees every replica's writes so far.
	Follow(ctx context.Context, apply func(id string, doc []byte)) error
	// Lead calls lead each time this replica gains the leadership (a Lease) and
	// cancels lead's context when it loses it; it returns when ctx ends.
	Lead(ctx context.Context, lead func(ctx context.Context))
}

// SandboxFetcher is a SharedStore that reads one sandbox's document from its source of
// truth, past any cache (kubestore: a GET on the API server). A replica uses it when
// asked about a sandbox it does not know yet: another replica may have created it a
// moment ago, before this replica's Follow delivered it. FetchSandbox returns nil (and
// no error) for a sandbox that does not exist.
type SandboxFetcher interface {
	FetchSandbox(ctx context.Context, id string) ([]byte, error)
}

// record is what the store keeps of one sandbox.
type record struct {
	ID             string            `json:"id"`
	ContainerID    string            `json:"containerID,omitempty"`
	Image          string            `json:"image"`
	Platform       *PlatformSpec     `json:"platform,omitempty"`
	Entrypoint     []string          `json:"entrypoint"`
	Metadata       map[string]string `json:"metadata"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	CreatedAt      time.Time         `json:"createdAt"`
	ExpiresAt      *time.Time        `json:"expiresAt,omitempty"`
	Status         Status            `json:"status"`
	// History holds the previous statuses, oldest first, at most historyLen.
	History []Status `json:"history,omitempty"`
	// AccessToken admits requests to the sandbox's token ports (always execd and the
	// egress API); every sandbox has one. SecureAccess is the create request's
	// secureAccess: every port needs the token. Records from before every sandbox had a
	// token lack SecureAccess (nil); reconcile fills both in (migrateAccess).
	AccessToken   string          `json:"accessToken,omitempty"`
	SecureAccess  *bool           `json:"secureAccess,omitempty"`
	Policy        json.RawMessage `json:"policy,omitempty"`
	PolicyVersion uint64          `json:"policyVersion,omitempty"`
	RenewOnAccess int             `json:"renewOnAccess,omitempty"`
	// CredentialProxy is credentialProxy.enabled at create (the vault is egressd's).
	CredentialProxy bool       `json:"credentialProxy,omitempty"`
	DeleteVolumes   []string   `json:"deleteVolumes,omitempty"`
	Address         netip.Addr `json:"address,omitzero"`
	Address6        netip.Addr `json:"address6,omitzero"`
	Pid             int        `json:"pid,omitempty"`
	HostInterface   string     `json:"hostInterface,omitempty"`
	// PodUID is the pod's UID (Kubernetes; Instance.PodUID).
	PodUID string `json:"podUID,omitempty"`
	// Node is the node that runs the sandbox (Kubernetes); empty on a single host.
	Node string `json:"node,omitempty"`
	// HostIP is the address of that node (Kubernetes; Instance.HostIP).
	HostIP string `json:"hostIP,omitempty"`
	// PolicyName names the library policy the sandbox runs under; then Policy holds only
	// the per-sandbox additions (rules put before the named policy's, OpenSandbox PATCH
	// semantics) and PolicyVersion counts their changes.
	PolicyName string `json:"policyName,omitempty"`
	// PinnedPolicy holds PolicyName at the version a snapshot captured (a sandbox
	// restored from it; policypin.go): the data plane enforces this document, not the
	// library's current version, until the policy API changes the sandbox's named
	// policy or gives it one of its own. Nil: the sandbox follows the library.
	PinnedPolicy *policyPin `json:"pinnedPolicy,omitempty"`
	// SnapshotID is the snapshot the sandbox was restored from (GET reports it as
	// snapshotId); empty for a sandbox created from an image.
	SnapshotID string `json:"snapshotId,omitempty"`
	// Claiming marks a claimed warm pool member whose claim may not have finished: a
	// claim stores the request's policy and Running together, in one write made before
	// the enforcement wait and execd's release, and answers without a second one, so
	// the mark stays stored until the record's next write. A leader that finds it at
	// start asks the sandbox's execd (confirmClaimAsync): released, the claim answered
	// and the mark is cleared; still held, the claim never answered and the sandbox is
	// removed.
	Claiming bool `json:"claiming,omitempty"`
	// Pool names the warm pool of a member not yet claimed (PoolSpec.Name): such a
	// record is not a sandbox of the API. Empty for every claimed or cold sandbox.
	Pool string `json:"pool,omitempty"`
	// SignedURLEpoch is covered by the tag of every signed URL minted for the sandbox
	// (signedurl.Keyring.MintEpoch); revoking the sandbox's signed URLs increments it.
	// Records from before it existed read as 0, the epoch of URLs minted without one.
	SignedURLEpoch uint64 `json:"signedUrlEpoch,omitempty"`
	// Events is the sandbox's diagnostic event ring (what lifecycle did and saw:
	// create, state transitions, policy versions stored and enforced, egress attached),
	// oldest first, at most eventRingLen; GET /sandboxes/{id}/diagnostics/events renders
	// it. Persisted with the record, so it survives restarts and replicas share it.
	Events []Event `json:"events,omitempty"`
	// Owner is the id of the principal that created the sandbox (package principal;
	// "admin" for the configured API key); empty for sandboxes created before
	// principals existed, which only roles seeing every sandbox reach. Answers carry
	// it as airlock.createdBy (SandboxExtension).
	Owner string `json:"owner,omitempty"`
	// Proposal is the last decision on the sandbox's policy proposal (POST
	// /sandboxes/{id}/policy/proposal); the next proposal reads the audit records after
	// the seq it covered. Persisted with the record, so a restart (or another replica)
	// keeps it. Nil: no decision yet.
	Proposal *ProposalMark `json:"proposal,omitempty"`
	// traceParent is the W3C traceparent of the create that made the sandbox, for the
	// data plane's spans of its first attach (watch.Sandbox.TraceParent); in memory
	// only, empty when traces are off or after a restart.
	traceParent string
}

const historyLen = 16

// placeWorkload records where the runtime says the sandbox's workload runs: its
// addresses, init pid, node and node address, and its veth and pod UID when the
// runtime knows them (an Inspect may not, and keeps what the record had).
func (r *record) placeWorkload(in Instance) {
	r.Address, r.Address6, r.Pid, r.Node, r.HostIP = in.Address, in.Address6, in.Pid, in.Node, in.HostIP
	if in.HostInterface != "" {
		r.HostInterface = in.HostInterface
	}
	if in.PodUID != "" {
		r.PodUID = in.PodUID
	}
}

// clone returns a deep copy of r.
func (r *record) clone() *record {
	c := *r
	c.Entrypoint = append([]string(nil), r.Entrypoint...)
	c.Metadata = cloneMap(r.Metadata)
	c.ResourceLimits = cloneMap(r.ResourceLimits)
	c.Extensions = cloneMap(r.Extensions)
	c.History = append([]Status(nil), r.History...)
	c.Events = append([]Event(nil), r.Events...)
	c.Policy = append(json.RawMessage(nil), r.Policy...)
	c.DeleteVolumes = append([]string(nil), r.DeleteVolumes...)
	if r.SecureAccess != nil {
		v := *r.SecureAccess
		c.SecureAccess = &v
	}
	if r.ExpiresAt != nil {
		t := *r.ExpiresAt
		c.ExpiresAt = &t
	}
	if r.Proposal != nil {
		m := *r.Proposal
		c.Proposal = &m
	}
	c.PinnedPolicy = r.PinnedPolicy.clone()
	return &c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// putRecord writes rec to st.
func putRecord(st StateStore, rec *record) error {
	b, err := encodeRecord(rec)
	if err != nil {
		return err
	}
	return st.PutSandbox(rec.ID, b)
}

// encodeRecord is the document of rec that a StateStore keeps.
func encodeRecord(rec *record) ([]byte, error) { return json.Marshal(rec) }

// decodeRecord decodes one sandbox document.
func decodeRecord(id string, doc []byte) (*record, error) {
	var r record
	if err := json.Unmarshal(doc, &r); err != nil {
		return nil, fmt.Errorf("store: record %q: %w", id, err)
	}
	return &r, nil
}

// allRecords returns every record of st, in no order. A record that does not decode is
// reported, not skipped.
func allRecords(st StateStore) ([]*record, error) {
	docs, err := st.Sandboxes()
	if err != nil {
		return nil, err
	}
	out := make([]*record, 0, len(docs))
	for id, doc := range docs {
		r, err := decodeRecord(id, doc)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
