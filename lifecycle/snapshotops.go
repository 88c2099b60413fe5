package lifecycle

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// snapshotTimeout bounds one capture (the commit of everything the sandbox wrote).
const snapshotTimeout = 15 * time.Minute

// CreateSnapshotRequest is the body of POST /sandboxes/{id}/snapshots
// (CreateSnapshotRequest): an optional name, at least one character. Unknown fields
// are refused (the schema's additionalProperties: false).
type CreateSnapshotRequest struct {
	Name *string `json:"name"`
}

// CreateSnapshot accepts a snapshot of Running sandbox id: it answers at once with the
// snapshot in state Creating (reason snapshot_accepted) and captures in the background,
// ending Ready (snapshot_ready) or Failed (snapshot_capture_failed,
// snapshot_limit_exceeded). Errors: ErrNotFound (unknown sandbox), ErrInvalidState (not
// Running), ErrSnapshotLimit (count limits), ErrNotImplemented (runtime or store
// without snapshots). The principal of ctx owns the snapshot.
func (s *Server) CreateSnapshot(ctx context.Context, id, name string) (Snapshot, error) {
	if err := s.snapshotsSupported(); err != nil {
		return Snapshot{}, err
	}
	s.syncSnapshots()
	e, err := s.lookup(id)
	if err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := e.rec.Status.State; st != opensandbox.Running {
		return Snapshot{}, fmt.Errorf("%w: sandbox %s is %s; a snapshot needs Running", ErrInvalidState, id, st)
	}
	l := s.snaps.limits
	per, total, perBytes, totalBytes := s.snapshotUsageLocked(id)
	switch {
	case per >= l.MaxPerSandbox:
		return Snapshot{}, fmt.Errorf("%w: sandbox %s has %d snapshots, the most this server keeps per sandbox; delete one first", ErrSnapshotLimit, id, per)
	case total >= l.MaxTotal:
		return Snapshot{}, fmt.Errorf("%w: this server keeps at most %d snapshots; delete one first", ErrSnapshotLimit, l.MaxTotal)
	case perBytes >= l.MaxBytesPerSandbox:
		return Snapshot{}, fmt.Errorf("%w: the snapshots of sandbox %s hold %d bytes, the most this server keeps per sandbox is %d", ErrSnapshotLimit, id, perBytes, l.MaxBytesPerSandbox)
	case totalBytes >= l.MaxBytesTotal:
		return Snapshot{}, fmt.Errorf("%w: snapshots hold %d bytes, the most this server keeps is %d", ErrSnapshotLimit, totalBytes, l.MaxBytesTotal)
	}
	now := time.Now().UTC()
	r := &snapshotRecord{
		ID: "snap-" + newSandboxID(), SandboxID: id, Name: name, Owner: principal.IDFromContext(ctx), CreatedAt: now,
		Status: SnapshotStatus{State: SnapshotCreating, Reason: "snapshot_accepted", Message: "Snapshot creation accepted.", LastTransitionAt: now},
	}
	if err := s.putSnapshotLocked(r); err != nil {
		return Snapshot{}, fmt.Errorf("store: %w", err)
	}
	s.snaps.byID[r.ID] = r
	out := r.view()
	s.wg.Go(func() { s.capture(r) })
	return out, nil
}

// capture takes the snapshot r accepted: under the source sandbox's operation lock (no
// delete, pause or policy-free window meanwhile) it records Airlock's state of the
// sandbox and has the runtime capture its root filesystem.
func (s *Server) capture(r *snapshotRecord) {
	start := time.Now()
	fail := func(reason, msg string) {
		s.mu.Lock()
		if err := s.setSnapshotStatusLocked(r, SnapshotFailed, reason, msg); err != nil {
			s.log.Error("persisting snapshot status failed", "snapshot_id", r.ID, "err", err)
		}
		s.mu.Unlock()
		s.log.Warn("snapshot failed", "snapshot_id", r.ID, "sandbox_id", r.SandboxID, "reason", reason, "message", msg)
	}
	e, err := s.lockOp(r.SandboxID)
	if err != nil {
		fail("snapshot_capture_failed", "the sandbox was deleted before it could be captured")
		return
	}
	defer e.op.Unlock()
	s.mu.Lock()
	rec := e.rec
	if rec.Status.State != opensandbox.Running {
		s.mu.Unlock()
		fail("snapshot_capture_failed", fmt.Sprintf("the sandbox is %s; a snapshot needs Running", rec.Status.State))
		return
	}
	src := snapshotSource{
		Image: rec.Image, Entrypoint: append([]string(nil), rec.Entrypoint...), Platform: rec.Platform,
		Extensions: cloneMap(rec.Extensions), Policy: append(json.RawMessage(nil), rec.Policy...),
		PolicyName: rec.PolicyName, PolicyVersion: rec.PolicyVersion, CredentialProxy: rec.CredentialProxy,
		RenewOnAccess: rec.RenewOnAccess,
	}
	if rec.SnapshotID != "" { // a snapshot of a restored sandbox keeps the first image it asked for
		if parent, ok := s.snaps.byID[rec.SnapshotID]; ok {
			src.Image = parent.Source.Image
		}
	}
	src.NamedPolicy, src.NamedVersion, src.NamedSHA256 = s.lib.capturedNamed(rec)
	inst := Instance{SandboxID: rec.ID, ContainerID: rec.ContainerID, Pid: rec.Pid, Address: rec.Address}
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(s.ctx, snapshotTimeout)
	defer cancel()
	if vc := s.vaultCopier(); vc != nil && src.CredentialProxy {
		if err := vc.CopyVault(inst.SandboxID, r.ID); err != nil {
			s.log.Error("copying the sandbox's vault into its snapshot failed", "snapshot_id", r.ID, "err", err)
			fail("snapshot_capture_failed", "the sandbox's credential vault could not be copied")
			return
		}
		src.Vault = true
	}
	art, err := s.snaps.rt.Snapshot(ctx, inst, r.ID, src.CredentialProxy)
	if err != nil {
		s.forgetVault(r.ID)
		fail("snapshot_capture_failed", err.Error())
		return
	}
	s.mu.Lock()
	l := s.snaps.limits
	_, _, perBytes, totalBytes := s.snapshotUsageLocked(r.SandboxID)
	over := ""
	switch {
	case perBytes+art.Bytes > l.MaxBytesPerSandbox:
		over = fmt.Sprintf("the snapshot holds %d bytes; with it the snapshots of sandbox %s would pass the limit of %d bytes", art.Bytes, r.SandboxID, l.MaxBytesPerSandbox)
	case totalBytes+art.Bytes > l.MaxBytesTotal:
		over = fmt.Sprintf("the snapshot holds %d bytes; with it all snapshots would pass the limit of %d bytes", art.Bytes, l.MaxBytesTotal)
	}
	if over == "" {
		r.Ref, r.Bytes, r.Source = art.Ref, art.Bytes, src
		err = s.setSnapshotStatusLocked(r, SnapshotReady, "snapshot_ready", "Snapshot is ready.")
	}
	s.mu.Unlock()
	if over != "" {
		if rmErr := s.snaps.rt.RemoveSnapshot(context.WithoutCancel(ctx), art.Ref); rmErr != nil {
			s.log.Error("removing a snapshot over the limit failed", "snapshot_id", r.ID, "err", rmErr)
		}
		s.forgetVault(r.ID)
		fail("snapshot_limit_exceeded", over)
		return
	}
	if err != nil {
		s.log.Error("persisting snapshot status failed", "snapshot_id", r.ID, "err", err)
	}
	s.log.Info("snapshot ready", "snapshot_id", r.ID, "sandbox_id", r.SandboxID, "bytes", art.Bytes,
		"snapshot_ms", time.Since(start).Milliseconds())
}

// GetSnapshot returns snapshot id (ErrSnapshotNotFound when unknown, or not the
// principal's of ctx when that is a user).
func (s *Server) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	if err := s.snapshotsSupported(); err != nil {
		return Snapshot{}, err
	}
	s.syncSnapshots()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.snaps.byID[id]
	if !ok || !r.visibleTo(ctx) {
		return Snapshot{}, fmt.Errorf("%w: %q", ErrSnapshotNotFound, id)
	}
	return r.view(), nil
}

// SnapshotFilter selects snapshots of GET /snapshots: SandboxID exact, States OR'ed
// (case-insensitive), Name exact (an SDK filter); Page from 1.
type SnapshotFilter struct {
	SandboxID, Name string
	States          []string
	Page, PageSize  int
}

// ListSnapshots returns one page of the snapshots f selects that the principal of ctx
// may see (a user: its own), newest first (ties by id).
func (s *Server) ListSnapshots(ctx context.Context, f SnapshotFilter) (ListSnapshotsResponse, error) {
	if err := s.snapshotsSupported(); err != nil {
		return ListSnapshotsResponse{}, err
	}
	s.syncSnapshots()
	s.mu.Lock()
	var all []Snapshot
	for _, r := range s.snaps.byID {
		if !r.visibleTo(ctx) || f.SandboxID != "" && r.SandboxID != f.SandboxID || f.Name != "" && r.Name != f.Name {
			continue
		}
		if len(f.States) > 0 && !slices.ContainsFunc(f.States, func(st string) bool { return strings.EqualFold(st, r.Status.State) }) {
			continue
		}
		all = append(all, r.view())
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b Snapshot) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return ListSnapshotsResponse{Items: page(all, f.Page, f.PageSize), Pagination: pagination(len(all), f.Page, f.PageSize)}, nil
}

// page returns page p (from 1) of size n of items, never nil.
func page[T any](items []T, p, n int) []T {
	lo := min((p-1)*n, len(items))
	hi := min(lo+n, len(items))
	return append(make([]T, 0, hi-lo), items[lo:hi]...)
}

// pagination describes page p of size n over total items (PaginationInfo).
func pagination(total, p, n int) Pagination {
	pages := (total + n - 1) / n
	return Pagination{Page: p, PageSize: n, TotalItems: total, TotalPages: pages, HasNextPage: p < pages}
}

// DeleteSnapshot removes snapshot id and its artifact: ErrSnapshotNotFound when
// unknown (or not the principal's of ctx when that is a user), ErrInvalidState while it
// is being created. Sandboxes restored from it keep
// running (the engine keeps the layers they use).
func (s *Server) DeleteSnapshot(ctx context.Context, id string) error {
	if err := s.snapshotsSupported(); err != nil {
		return err
	}
	s.syncSnapshots()
	s.mu.Lock()
	r, ok := s.snaps.byID[id]
	if !ok || !r.visibleTo(ctx) {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrSnapshotNotFound, id)
	}
	if st := r.Status.State; st == SnapshotCreating || st == SnapshotDeleting {
		s.mu.Unlock()
		return fmt.Errorf("%w: snapshot %s is %s; it can be deleted once Ready or Failed", ErrInvalidState, id, st)
	}
	ref := r.Ref
	err := s.setSnapshotStatusLocked(r, SnapshotDeleting, "snapshot_deleting", "")
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if ref != "" {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := s.snaps.rt.RemoveSnapshot(rctx, ref); err != nil {
			s.mu.Lock()
			_ = s.setSnapshotStatusLocked(r, SnapshotFailed, "snapshot_delete_failed", err.Error())
			s.mu.Unlock()
			return fmt.Errorf("removing snapshot %s: %w", id, err)
		}
	}
	s.forgetVault(id)
	s.mu.Lock()
	delete(s.snaps.byID, id)
	err = s.snaps.store.DeleteSnapshot(id)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.log.Info("snapshot deleted", "snapshot_id", id, "sandbox_id", r.SandboxID)
	return nil
}

// snapshotRoutes mounts the snapshot routes on m.
func (s *Server) snapshotRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.handleCreateSnapshot)
	m.HandleFunc("GET /snapshots", s.handleListSnapshots)
	m.HandleFunc("GET /snapshots/{sid}", func(w http.ResponseWriter, r *http.Request) {
		sn, err := s.GetSnapshot(r.Context(), r.PathValue("sid"))
		if err != nil {
			fail(s.log, w, r, err)
			return
		}
		opensandbox.WriteJSON(w, http.StatusOK, sn)
	})
	m.HandleFunc("DELETE /snapshots/{sid}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.DeleteSnapshot(r.Context(), r.PathValue("sid")); err != nil {
			fail(s.log, w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	var req CreateSnapshotRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) { // the body is optional
		fail(s.log, w, r, fmt.Errorf("%w: %v", ErrInvalidJSON, err))
		return
	}
	name := ""
	if req.Name != nil {
		if name = *req.Name; name == "" || len(name) > 253 {
			fail(s.log, w, r, fmt.Errorf("%w: name must be 1 to 253 characters", ErrInvalidRequest))
			return
		}
	}
	sn, err := s.CreateSnapshot(r.Context(), r.PathValue("id"), name)
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+sn.ID)
	opensandbox.WriteJSON(w, http.StatusAccepted, sn)
}

func (s *Server) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := SnapshotFilter{SandboxID: q.Get("sandboxId"), Name: q.Get("name")}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			if one = strings.TrimSpace(one); one != "" {
				f.States = append(f.States, one)
			}
		}
	}
	var err error
	if f.Page, err = intParam(q, "page", 1, 1, 1<<31-1); err != nil {
		fail(s.log, w, r, err)
		return
	}
	if f.PageSize, err = intParam(q, "pageSize", 20, 1, 1000); err != nil {
		fail(s.log, w, r, err)
		return
	}
	out, err := s.ListSnapshots(r.Context(), f)
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, out)
}
