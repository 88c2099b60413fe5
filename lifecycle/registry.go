package lifecycle

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newSandboxID returns 16 characters [a-z0-9] starting with a letter: no '-', so the
// gateway's <id>-<port> host labels are unambiguous.
func newSandboxID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	out := make([]byte, len(b))
	for i, c := range b {
		if i == 0 {
			out[i] = idAlphabet[int(c)%26]
			continue
		}
		out[i] = idAlphabet[int(c)%len(idAlphabet)]
	}
	return string(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// view is the wire form of rec; full adds what the create response leaves out.
func (rec *record) view(full bool) Sandbox {
	sb := Sandbox{
		ID:         rec.ID,
		Platform:   rec.Platform,
		Status:     rec.Status,
		Metadata:   cloneMap(rec.Metadata),
		Entrypoint: append([]string(nil), rec.Entrypoint...),
		CreatedAt:  rec.CreatedAt,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if rec.Owner != "" {
		sb.Airlock = &SandboxExtension{CreatedBy: rec.Owner}
	}
	switch {
	case full && rec.SnapshotID != "":
		sb.SnapshotID = rec.SnapshotID // a restored sandbox reports its startup source, not an image
	case full:
		sb.Image = &ImageSpec{URI: rec.Image}
	}
	if rec.ExpiresAt != nil {
		t := *rec.ExpiresAt
		sb.ExpiresAt = &t
	}
	return sb
}

// watchView is what the data plane learns of rec; s.mu is held (or rec is not shared
// yet).
func (s *Server) watchView(rec *record) watch.Sandbox {
	w := watch.Sandbox{
		ID:       rec.ID,
		Node:     rec.Node,
		State:    string(rec.Status.State),
		Address:  rec.Address,
		Address6: rec.Address6,
		Runtime:  watch.Runtime{Kind: s.rt.Kind(), ContainerID: rec.ContainerID, Pid: rec.Pid, HostInterface: rec.HostInterface, PodUID: rec.PodUID, HostIP: rec.HostIP},
		// PolicyVersion only means something with a policy.
		RenewOnAccess:   rec.RenewOnAccess,
		CredentialProxy: rec.CredentialProxy,
		Access:          s.rules.watchAccess(rec),
		Pool:            rec.Pool,
		Owner:           rec.Owner,
		TraceParent:     rec.traceParent,
	}
	doc, v := s.lib.effective(rec)
	w.Policy, w.PolicyVersion = append(json.RawMessage(nil), doc...), v
	if rec.ExpiresAt != nil {
		t := *rec.ExpiresAt
		w.ExpiresAt = &t
	}
	return w
}

// commitLocked persists rec and publishes it to the watch; s.mu is held.
func (s *Server) commitLocked(rec *record) error {
	if err := putRecord(s.store, rec); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.hub.Put(s.watchView(rec))
	return nil
}

// setStatusLocked moves rec to state, keeps the previous status in its history,
// persists and publishes. s.mu is held.
func (s *Server) setStatusLocked(rec *record, state opensandbox.State, reason, msg string) error {
	s.applyStatusLocked(rec, state, reason, msg)
	return s.commitLocked(rec)
}

// applyStatusLocked moves rec to state in memory (history, event, metrics) without
// persisting or publishing it. s.mu is held.
func (s *Server) applyStatusLocked(rec *record, state opensandbox.State, reason, msg string) {
	if rec.Status.State != "" {
		rec.History = append(rec.History, rec.Status)
		if n := len(rec.History); n > historyLen {
			rec.History = rec.History[n-historyLen:]
		}
	}
	rec.Status = Status{State: state, Reason: reason, Message: msg, LastTransitionAt: time.Now().UTC()}
	statusEventLocked(rec, state, reason, msg)
	s.metrics.transition(state)
}

// setStatus is setStatusLocked taking s.mu; failures to persist are logged (the state is
// still changed in memory and published).
func (s *Server) setStatus(rec *record, state opensandbox.State, reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.setStatusLocked(rec, state, reason, msg); err != nil {
		s.log.Error("persisting sandbox status failed", "sandbox_id", rec.ID, "state", state, "err", err)
	}
}

// lookup returns the entry of id or ErrNotFound.
func (s *Server) lookup(id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return e, nil
}

// lockOp takes the entry's operation lock and checks it still exists.
func (s *Server) lockOp(id string) (*entry, error) {
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	e.op.Lock()
	s.mu.Lock()
	cur, ok := s.sbx[id]
	s.mu.Unlock()
	if !ok || cur != e {
		e.op.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return e, nil
}

// peek runs fn on the record of sandbox id under the registry lock and reports
// whether the sandbox exists. fn must neither block nor call back into the Server.
func (s *Server) peek(id string, fn func(rec *record)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if ok {
		fn(e.rec)
	}
	return ok
}

// each runs fn on the record of every sandbox under the registry lock, in no order. fn
// must neither block nor call back into the Server.
func (s *Server) each(fn func(rec *record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.sbx {
		fn(e.rec)
	}
}

// Get returns the sandbox id.
func (s *Server) Get(id string) (Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return e.rec.view(true), nil
}

// ListFilter selects sandboxes: any of States (case-insensitive), all of Metadata,
// and, when Owner is set, only the sandboxes that principal created.
type ListFilter struct {
	States         []string
	Metadata       map[string]string
	Owner          string
	Page, PageSize int
}

// List returns one page of the sandboxes matching f, newest first.
func (s *Server) List(f ListFilter) ListResponse {
	s.mu.Lock()
	var match []*record
	for _, e := range s.sbx {
		rec := e.rec
		if len(f.States) > 0 && !slices.ContainsFunc(f.States, func(st string) bool {
			return strings.EqualFold(st, string(rec.Status.State))
		}) {
			continue
		}
		if f.Owner != "" && rec.Owner != f.Owner {
			continue
		}
		ok := true
		for k, v := range f.Metadata {
			if got, has := rec.Metadata[k]; !has || got != v {
				ok = false
				break
			}
		}
		if ok {
			match = append(match, rec)
		}
	}
	slices.SortFunc(match, func(a, b *record) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	total := len(match)
	from := min((f.Page-1)*f.PageSize, total)
	to := min(from+f.PageSize, total)
	items := make([]Sandbox, 0, to-from)
	for _, rec := range match[from:to] {
		items = append(items, rec.view(true))
	}
	s.mu.Unlock()
	pages := (total + f.PageSize - 1) / f.PageSize
	return ListResponse{Items: items, Pagination: Pagination{
		Page: f.Page, PageSize: f.PageSize, TotalItems: total, TotalPages: pages, HasNextPage: f.Page < pages,
	}}
}

// Renew moves the expiry of a sandbox that has one to at (in the future, at most the
// maximum timeout from now).
func (s *Server) Renew(id string, at time.Time) (time.Time, error) {
	now := time.Now()
	if !at.After(now) {
		return time.Time{}, fmt.Errorf("%w: expiresAt %s is not in the future", ErrInvalidRequest, at.Format(time.RFC3339))
	}
	if at.Sub(now) > s.cfg.Limits.MaxTimeout {
		return time.Time{}, fmt.Errorf("%w: expiresAt is more than the maximum timeout (%s) from now", ErrInvalidRequest, s.cfg.Limits.MaxTimeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return time.Time{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	switch {
	case rec.ExpiresAt == nil:
		return time.Time{}, fmt.Errorf("%w: sandbox %s was created for manual cleanup and has no expiry", ErrInvalidState, id)
	case rec.Status.State.Terminal() || rec.Status.State == opensandbox.Stopping:
		return time.Time{}, fmt.Errorf("%w: sandbox %s is %s", ErrInvalidState, id, rec.Status.State)
	}
	at = at.UTC()
	rec.ExpiresAt = &at
	if err := s.commitLocked(rec); err != nil {
		return time.Time{}, err
	}
	return at, nil
}

// RenewOnAccess is the gateway's renew intent (OSEP-0009): for a sandbox created with
// extensions["access.renew.extend.seconds"], it moves the expiry to now + that many
// seconds when that is later than the current expiry, and returns the expiry. Other
// sandboxes are left alone (ok false). It performs no I/O besides the store write.
func (s *Server) RenewOnAccess(id string) (at time.Time, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, found := s.sbx[id]
	if !found {
		return time.Time{}, false, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	if rec.RenewOnAccess <= 0 || rec.ExpiresAt == nil || rec.Status.State.Terminal() || rec.Status.State == opensandbox.Stopping {
		return time.Time{}, false, nil
	}
	next := time.Now().UTC().Add(time.Duration(rec.RenewOnAccess) * time.Second)
	if !next.After(*rec.ExpiresAt) {
		return *rec.ExpiresAt, true, nil
	}
	old := rec.ExpiresAt
	rec.ExpiresAt = &next
	if err := s.commitLocked(rec); err != nil {
		rec.ExpiresAt = old
		return time.Time{}, false, err
	}
	return next, true, nil
}

// PatchMetadata applies a JSON merge patch (RFC 7396: null deletes) to the sandbox's
// metadata and returns the whole sandbox.
func (s *Server) PatchMetadata(id string, patch map[string]*string) (Sandbox, error) {
	for k, v := range patch {
		if err := validateMetadataKey(k); err != nil {
			return Sandbox{}, err
		}
		if v != nil {
			if err := validateMetadataValue(k, *v); err != nil {
				return Sandbox{}, err
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	next := cloneMap(e.rec.Metadata)
	if next == nil {
		next = map[string]string{}
	}
	for k, v := range patch {
		if v == nil {
			delete(next, k)
		} else {
			next[k] = *v
		}
	}
	old := e.rec.Metadata
	e.rec.Metadata = next
	if err := s.commitLocked(e.rec); err != nil {
		e.rec.Metadata = old
		return Sandbox{}, err
	}
	return e.rec.view(true), nil
}
