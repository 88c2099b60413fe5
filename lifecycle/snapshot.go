package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockdev/airlock/principal"
)

// Snapshots (docs/spec/sandbox-lifecycle.yml: /snapshots, /snapshots/{snapshotId},
// /sandboxes/{sandboxId}/snapshots, CreateSandboxRequest.snapshotId): a snapshot is
// the sandbox's root filesystem as the runtime captured it (Snapshotter) plus
// Airlock's own state of the sandbox at that moment (snapshotSource: policy reference
// and additions at their versions, the image it asked for, its entrypoint and
// settings). Snapshots are records of their own in the store (SnapshotStore): they
// outlive their source sandbox and are listed and deleted on their own.

// Snapshotter is implemented by runtimes that capture a sandbox's root filesystem
// (Docker: docker commit). Both methods perform engine I/O and may take seconds to
// minutes (the commit copies what the sandbox wrote); callers pass a deadline.
type Snapshotter interface {
	// Snapshot captures the root filesystem of the sandbox's container inst as an
	// artifact named after snapshotID that Spec.Image can start a sandbox from, without
	// the sandbox's volumes and without what the runtime injected (execd's token, the
	// credential proxy's CA when trustInstalled). Errors are for the snapshot's
	// Failed message.
	Snapshot(ctx context.Context, inst Instance, snapshotID string, trustInstalled bool) (SnapshotArtifact, error)
	// RemoveSnapshot removes an artifact Snapshot made; a missing one is not an error.
	RemoveSnapshot(ctx context.Context, ref string) error
}

// SnapshotChecker is implemented by a Snapshotter that may be configured without what
// it needs (the Kubernetes runtime without the node agent): CanSnapshot returns nil,
// or an error; the server then answers the snapshot routes 501 as for a runtime
// without snapshots.
type SnapshotChecker interface {
	CanSnapshot() error
}

// VaultCopier is a CredentialVault that copies one holder's credentials and bindings to
// another inside the vault (egressd/vault.Store.CopyVault): values stay sealed there
// and never pass through lifecycle. Snapshots use it to re-bind a sandbox's vault: to
// the snapshot's id at capture, from it to each restored sandbox at create. A vault
// without it leaves restored sandboxes with an empty vault. On Kubernetes (cluster's
// node vault) the capture's copy is made by the source's node at once and the
// restore's when the new pod runs there, before its entrypoint is released (the ready
// gate retries it until the ready timeout).
type VaultCopier interface {
	CopyVault(from, to string) error
}

// SnapshotArtifact is what a Snapshotter made: Ref is what Spec.Image takes to restore
// it (Docker: the image reference airlock/snapshot:<id>), Bytes what it costs on disk
// beyond its base (Docker: the committed layer's size).
type SnapshotArtifact struct {
	Ref   string
	Bytes int64
}

// SnapshotStore is a StateStore that also keeps snapshot records (boltstore: the
// "snapshots" bucket). A server whose store or runtime lacks snapshots answers the
// snapshot routes 501.
type SnapshotStore interface {
	// PutSnapshot writes the document of snapshot id, replacing any previous one.
	PutSnapshot(id string, doc []byte) error
	// DeleteSnapshot removes it; a missing one is not an error.
	DeleteSnapshot(id string) error
	// Snapshots returns every snapshot document by id.
	Snapshots() (map[string][]byte, error)
}

// SnapshotLimits bounds snapshots; a create past a limit answers 409
// SNAPSHOT_LIMIT_EXCEEDED. Zero means the default.
type SnapshotLimits struct {
	// MaxPerSandbox and MaxTotal bound how many snapshots (any state) exist of one
	// source sandbox and in all; defaults 16 and 256.
	MaxPerSandbox, MaxTotal int
	// MaxBytesPerSandbox and MaxBytesTotal bound the bytes the Ready snapshots of one
	// source sandbox and of all hold (SnapshotArtifact.Bytes); defaults 10 GiB and
	// 100 GiB. A capture that would pass one ends Failed (reason
	// snapshot_limit_exceeded) and its artifact is removed.
	MaxBytesPerSandbox, MaxBytesTotal int64
}

func (l *SnapshotLimits) setDefaults() {
	if l.MaxPerSandbox <= 0 {
		l.MaxPerSandbox = 16
	}
	if l.MaxTotal <= 0 {
		l.MaxTotal = 256
	}
	if l.MaxBytesPerSandbox <= 0 {
		l.MaxBytesPerSandbox = 10 << 30
	}
	if l.MaxBytesTotal <= 0 {
		l.MaxBytesTotal = 100 << 30
	}
}

// Snapshot states (SnapshotState) and reasons (SnapshotStatus.reason).
const (
	SnapshotCreating = "Creating"
	SnapshotReady    = "Ready"
	SnapshotFailed   = "Failed"
	SnapshotDeleting = "Deleting"
)

// SnapshotStatus is the wire form of a snapshot's status (SnapshotStatus).
type SnapshotStatus struct {
	State            string    `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt"`
}

// Snapshot is the wire form of a snapshot (Snapshot).
type Snapshot struct {
	ID        string         `json:"id"`
	SandboxID string         `json:"sandboxId"`
	Name      string         `json:"name,omitempty"`
	Status    SnapshotStatus `json:"status"`
	CreatedAt time.Time      `json:"createdAt"`
}

// ListSnapshotsResponse is the body of GET /snapshots (ListSnapshotsResponse).
type ListSnapshotsResponse struct {
	Items      []Snapshot `json:"items"`
	Pagination Pagination `json:"pagination"`
}

// snapshotSource is Airlock's state of the source sandbox at capture: what a restore
// takes over unless its request says otherwise.
type snapshotSource struct {
	// Image is the image the source sandbox asked for (before aliases).
	Image      string            `json:"image"`
	Entrypoint []string          `json:"entrypoint"`
	Platform   *PlatformSpec     `json:"platform,omitempty"`
	Extensions map[string]string `json:"extensions,omitempty"`
	// Policy, PolicyName and PolicyVersion are the sandbox's stored policy: its own
	// document, or the named library policy and the sandbox's additions, and the
	// version count of that state. NamedVersion, NamedSHA256 and NamedPolicy are the
	// named policy the source ran when captured (its pin, else the library's version
	// then): its version, its file's SHA-256 and its document (Airlock JSON form). A
	// restore under PolicyName is pinned to NamedPolicy (policypin.go); a snapshot from
	// before pins lacks it, and its restores run the library's current version.
	Policy          json.RawMessage `json:"policy,omitempty"`
	PolicyName      string          `json:"policyName,omitempty"`
	PolicyVersion   uint64          `json:"policyVersion,omitempty"`
	NamedVersion    uint64          `json:"namedVersion,omitempty"`
	NamedSHA256     string          `json:"namedSha256,omitempty"`
	NamedPolicy     json.RawMessage `json:"namedPolicy,omitempty"`
	CredentialProxy bool            `json:"credentialProxy,omitempty"`
	RenewOnAccess   int             `json:"renewOnAccess,omitempty"`
	// Vault is set when the vault holds a copy of the source's credentials and
	// bindings under the snapshot's id (VaultCopier).
	Vault bool `json:"vault,omitempty"`
}

// snapshotRecord is what the store keeps of one snapshot.
type snapshotRecord struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	Name      string `json:"name,omitempty"`
	// Owner is the id of the principal that took the snapshot (package principal); a
	// user principal sees, restores and deletes only its own snapshots.
	Owner     string         `json:"owner,omitempty"`
	Status    SnapshotStatus `json:"status"`
	CreatedAt time.Time      `json:"createdAt"`
	// Ref and Bytes are the runtime's artifact (SnapshotArtifact), set once Ready.
	Ref    string         `json:"ref,omitempty"`
	Bytes  int64          `json:"bytes,omitempty"`
	Source snapshotSource `json:"source"`
}

// visibleTo reports whether the principal of ctx may see r: every role but user sees
// every snapshot, a user those it took; a context without a principal (a call from
// inside the server) sees all.
func (r *snapshotRecord) visibleTo(ctx context.Context) bool {
	p, ok := principal.FromContext(ctx)
	return !ok || p.Role.OwnsAll() || r.Owner == p.ID
}

func (r *snapshotRecord) view() Snapshot {
	return Snapshot{ID: r.ID, SandboxID: r.SandboxID, Name: r.Name, Status: r.Status, CreatedAt: r.CreatedAt}
}

// vaultCopier is the server's vault when it copies (VaultCopier), else nil.
func (s *Server) vaultCopier() VaultCopier {
	vc, _ := s.cfg.CredentialVault.(VaultCopier)
	return vc
}

// snapshots is the server's snapshot registry: the runtime and store that make
// snapshots possible (nil: the routes answer 501) and the records by id, guarded by
// Server.mu.
type snapshots struct {
	rt     Snapshotter
	off    error // why a SnapshotChecker runtime cannot snapshot (rt is then nil)
	store  SnapshotStore
	limits SnapshotLimits
	byID   map[string]*snapshotRecord
}

// supported reports (nil) whether this server can snapshot: a runtime and a store that
// both do.
func (s *Server) snapshotsSupported() error {
	if s.snaps.off != nil {
		return s.snaps.off
	}
	if s.snaps.rt == nil {
		return fmt.Errorf("%w: snapshots are not supported on the %s runtime yet", ErrNotImplemented, s.rt.Kind())
	}
	if s.snaps.store == nil {
		return fmt.Errorf("%w: this server's state store keeps no snapshots", ErrNotImplemented)
	}
	return nil
}

// loadSnapshots reads the store's snapshots into the registry; one left Creating by a
// crash is Failed (snapshot_interrupted) and its artifact, if any, removed.
func (s *Server) loadSnapshots(ctx context.Context) error {
	if s.snapshotsSupported() != nil {
		return nil
	}
	docs, err := s.snaps.store.Snapshots()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, doc := range docs {
		var r snapshotRecord
		if err := json.Unmarshal(doc, &r); err != nil {
			return fmt.Errorf("store: snapshot %q: %w", id, err)
		}
		busy := r.Status.State == SnapshotCreating || r.Status.State == SnapshotDeleting
		if busy && s.sharedSnapshots() && time.Since(r.Status.LastTransitionAt) < snapshotTimeout {
			busy = false // another replica may be making or deleting it
		}
		if busy {
			r.Status = SnapshotStatus{State: SnapshotFailed, Reason: "snapshot_interrupted",
				Message: "the server stopped while the snapshot was being made or deleted", LastTransitionAt: time.Now().UTC()}
			if err := s.putSnapshotLocked(&r); err != nil {
				return err
			}
		}
		s.snaps.byID[id] = &r
	}
	return nil
}

// putSnapshotLocked writes r to the store; s.mu is held.
func (s *Server) putSnapshotLocked(r *snapshotRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.snaps.store.PutSnapshot(r.ID, b)
}

// setSnapshotStatusLocked moves r to state (lastTransitionAt now, never before the
// previous one) and persists it; s.mu is held.
func (s *Server) setSnapshotStatusLocked(r *snapshotRecord, state, reason, msg string) error {
	now := time.Now().UTC()
	if !now.After(r.Status.LastTransitionAt) {
		now = r.Status.LastTransitionAt.Add(time.Microsecond)
	}
	r.Status = SnapshotStatus{State: state, Reason: reason, Message: msg, LastTransitionAt: now}
	return s.putSnapshotLocked(r)
}

// snapshotUsageLocked counts the snapshots of sandbox id and of all, and the bytes of
// those; s.mu is held.
func (s *Server) snapshotUsageLocked(id string) (perCount, total int, perBytes, totalBytes int64) {
	for _, r := range s.snaps.byID {
		total++
		totalBytes += r.Bytes
		if r.SandboxID == id {
			perCount++
			perBytes += r.Bytes
		}
	}
	return
}

// snapshotFor returns a copy of snapshot id for a restore by the principal of ctx:
// ErrSnapshotNotFound when unknown or not the principal's (a user's), ErrInvalidState
// unless Ready.
func (s *Server) snapshotFor(ctx context.Context, id string) (snapshotRecord, error) {
	if err := s.snapshotsSupported(); err != nil {
		return snapshotRecord{}, err
	}
	s.syncSnapshots()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.snaps.byID[id]
	if !ok || !r.visibleTo(ctx) {
		return snapshotRecord{}, fmt.Errorf("%w: %q", ErrSnapshotNotFound, id)
	}
	if r.Status.State != SnapshotReady {
		return snapshotRecord{}, fmt.Errorf("%w: snapshot %s is %s; a restore needs Ready", ErrInvalidState, id, r.Status.State)
	}
	c := *r
	c.Source.Entrypoint = append([]string(nil), r.Source.Entrypoint...)
	c.Source.Extensions = cloneMap(r.Source.Extensions)
	c.Source.Policy = append(json.RawMessage(nil), r.Source.Policy...)
	c.Source.NamedPolicy = append(json.RawMessage(nil), r.Source.NamedPolicy...)
	return c, nil
}

// restoreSpec fills what a create from snapshot sn takes over from it into v: the
// artifact as the image, the source's entrypoint when the request gives none, the
// source's policy (its own document or additions to its named policy) when the request
// names neither a networkPolicy nor a library policy (policyName), the credential
// proxy, renew-on-access. The request's env, metadata, timeout and resources stay the
// request's; env the request sets overrides the snapshot's (the artifact's image env).
func restoreSpec(v *validated, sn *snapshotRecord, policyName string) {
	v.spec.Image = sn.Ref
	if len(v.spec.Entrypoint) == 0 {
		v.spec.Entrypoint = append([]string(nil), sn.Source.Entrypoint...)
	}
	if len(v.policy) == 0 && policyName == "" {
		v.policy = append(json.RawMessage(nil), sn.Source.Policy...)
	}
	v.credentialProxy = v.credentialProxy || sn.Source.CredentialProxy
	if v.renewOnAccess == 0 {
		v.renewOnAccess = sn.Source.RenewOnAccess
	}
}
