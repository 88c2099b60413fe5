package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// createTimeout bounds a create's runtime work (an image pull included), independent of
// the client's connection: a client that hangs up never leaves a half-made sandbox.
const createTimeout = 10 * time.Minute

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
	if full {
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
		Runtime:  watch.Runtime{Kind: s.rt.Kind(), ContainerID: rec.ContainerID, Pid: rec.Pid, HostInterface: rec.HostInterface},
		// PolicyVersion only means something with a policy.
		RenewOnAccess:   rec.RenewOnAccess,
		CredentialProxy: rec.CredentialProxy,
		Access:          s.access(rec),
		Pool:            rec.Pool,
	}
	doc, v := s.effectiveLocked(rec)
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
	if rec.Status.State != "" {
		rec.History = append(rec.History, rec.Status)
		if n := len(rec.History); n > historyLen {
			rec.History = rec.History[n-historyLen:]
		}
	}
	rec.Status = Status{State: state, Reason: reason, Message: msg, LastTransitionAt: time.Now().UTC()}
	s.metrics.transition(state)
	return s.commitLocked(rec)
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

// Create validates req, creates and starts the sandbox's container and answers with
// the new sandbox in state Pending; it becomes Running once execd answers /ping. On
// error nothing is left behind.
func (s *Server) Create(ctx context.Context, req *CreateRequest) (Sandbox, error) {
	start := time.Now()
	v, err := validateCreate(req, s.cfg.Limits)
	if err != nil {
		return Sandbox{}, err
	}
	for k, val := range s.cfg.DefaultEnv {
		if _, set := v.spec.Env[k]; !set {
			v.spec.Env[k] = val
		}
	}
	policyName := req.Extensions[ExtPolicy]
	if policyName == "" && len(v.policy) == 0 {
		policyName = s.cfg.DefaultPolicy
	}
	if policyName != "" {
		if _, err := s.named(policyName, false); err != nil {
			return Sandbox{}, err
		}
	}
	asked := v.spec.Image
	if local, ok := s.cfg.ImageAliases[asked]; ok {
		v.spec.Image = local
	}
	id := newSandboxID()
	v.spec.SandboxID = id
	v.spec.Hold = true // released by awaitReadyAsync once enforced
	if v.credentialProxy {
		if s.cfg.CredentialVault == nil {
			return Sandbox{}, fmt.Errorf("%w: credentialProxy is not available: this server runs no Credential Vault", ErrInvalidRequest)
		}
		_, _, ca, err := s.cfg.CredentialVault.CA(id)
		if err != nil {
			return Sandbox{}, fmt.Errorf("credential proxy CA for %s: %w", id, err)
		}
		v.spec.TrustedCAPEM = ca
	}
	now := time.Now().UTC()
	rec := &record{
		ID:              id,
		Image:           asked,
		Platform:        req.Platform,
		Entrypoint:      v.spec.Entrypoint,
		Metadata:        cloneMap(req.Metadata),
		ResourceLimits:  cloneMap(v.limits),
		Extensions:      cloneMap(req.Extensions),
		CreatedAt:       now,
		Policy:          v.policy,
		PolicyName:      policyName,
		RenewOnAccess:   v.renewOnAccess,
		CredentialProxy: v.credentialProxy,
	}
	if rec.Metadata == nil {
		rec.Metadata = map[string]string{}
	}
	if len(v.policy) > 0 || policyName != "" {
		rec.PolicyVersion = 1
	}
	if v.timeout > 0 {
		exp := now.Add(v.timeout)
		rec.ExpiresAt = &exp
	}
	secure := req.SecureAccess
	rec.AccessToken, rec.SecureAccess = newAccessToken(), &secure

	s.mu.Lock()
	v.spec.Egress = s.egressOfLocked(rec)
	s.mu.Unlock()

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer cancel()
	if p := s.poolFor(v); p != nil {
		if out, ok := s.claim(rctx, p, v, rec); ok {
			s.metrics.creates.WithLabelValues("ok").Inc()
			s.metrics.createSeconds.Observe(time.Since(start).Seconds())
			s.log.Info("sandbox created from warm pool", "sandbox_id", out.ID, "pool", p.spec.Name, "image", rec.Image,
				"create_ms", time.Since(start).Milliseconds())
			return out, nil
		}
	}
	inst, err := s.rt.Create(rctx, v.spec)
	if err != nil && asked != v.spec.Image && errors.Is(err, ErrImageUnavailable) {
		err = fmt.Errorf("%w (this server serves %s from the local image %s: images.aliases)", err, asked, v.spec.Image)
	}
	if err != nil {
		s.forgetVault(id)
		s.metrics.creates.WithLabelValues("error").Inc()
		return Sandbox{}, err
	}
	rec.ContainerID, rec.Address, rec.Address6, rec.Pid, rec.DeleteVolumes = inst.ContainerID, inst.Address, inst.Address6, inst.Pid, inst.DeleteVolumes
	rec.HostInterface, rec.Node = inst.HostInterface, inst.Node

	s.mu.Lock()
	err = s.setStatusLocked(rec, opensandbox.Pending, "provisioning", "container started; waiting for execd")
	if err == nil {
		s.sbx[id] = &entry{rec: rec}
	}
	out := rec.view(false)
	s.mu.Unlock()
	if err != nil {
		s.hub.Delete(id)
		if rmErr := s.rt.Remove(rctx, inst); rmErr != nil {
			s.log.Error("removing container after a failed create", "sandbox_id", id, "err", rmErr)
		}
		s.forgetVault(id)
		s.metrics.creates.WithLabelValues("error").Inc()
		return Sandbox{}, err
	}
	s.metrics.creates.WithLabelValues("ok").Inc()
	s.metrics.createSeconds.Observe(time.Since(start).Seconds())
	s.log.Info("sandbox created", "sandbox_id", id, "image", rec.Image, "container_id", short(inst.ContainerID),
		"address", inst.Address, "create_ms", time.Since(start).Milliseconds())
	s.awaitReadyAsync(id, rec.Address)
	return out, nil
}

func short(cid string) string {
	if len(cid) > 12 {
		return cid[:12]
	}
	return cid
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

// ListFilter selects sandboxes: any of States (case-insensitive), all of Metadata.
type ListFilter struct {
	States         []string
	Metadata       map[string]string
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

// Delete kills and removes the sandbox (also when paused) and forgets it. reason is
// recorded in the Stopping status ("user_delete", "ttl_expiry").
func (s *Server) Delete(ctx context.Context, id, reason string) error {
	e, err := s.lockOp(id)
	if err != nil {
		return err
	}
	defer e.op.Unlock()
	s.setStatus(e.rec, opensandbox.Stopping, reason, "removing the container")
	s.mu.Lock()
	inst := Instance{SandboxID: id, ContainerID: e.rec.ContainerID, DeleteVolumes: append([]string(nil), e.rec.DeleteVolumes...)}
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := s.rt.Remove(rctx, inst); err != nil {
		s.setStatus(e.rec, opensandbox.Failed, "remove_failed", err.Error())
		return fmt.Errorf("removing sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.sbx, id)
	err = s.store.DeleteSandbox(id)
	s.mu.Unlock()
	s.hub.Delete(id)
	s.forgetVault(id)
	s.proxyTransport.CloseIdleConnections()
	s.metrics.transition(opensandbox.Terminated)
	s.log.Info("sandbox removed", "sandbox_id", id, "reason", reason)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Pause freezes a Running sandbox (409 otherwise).
func (s *Server) Pause(ctx context.Context, id string) error {
	return s.transition(ctx, id, opensandbox.Running, opensandbox.Pausing, opensandbox.Paused, "paused", s.rt.Pause)
}

// Resume thaws a Paused sandbox (409 otherwise).
func (s *Server) Resume(ctx context.Context, id string) error {
	return s.transition(ctx, id, opensandbox.Paused, opensandbox.Resuming, opensandbox.Running, "resumed", s.rt.Resume)
}

func (s *Server) transition(ctx context.Context, id string, from, via, to opensandbox.State, reason string, do func(context.Context, string) error) error {
	e, err := s.lockOp(id)
	if err != nil {
		return err
	}
	defer e.op.Unlock()
	s.mu.Lock()
	cur, cid := e.rec.Status.State, e.rec.ContainerID
	s.mu.Unlock()
	if cur != from {
		return fmt.Errorf("%w: sandbox %s is %s; this needs %s", ErrInvalidState, id, cur, from)
	}
	s.setStatus(e.rec, via, reason, "")
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := do(rctx, cid); err != nil {
		s.setStatus(e.rec, from, "runtime_error", err.Error())
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	s.setStatus(e.rec, to, reason, "")
	return nil
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

// Endpoint answers where a client reaches a port of a sandbox (GET
// /sandboxes/{id}/endpoints/{port}): the configured EndpointFunc, or this server's
// proxy. For a token port (execd, the egress API, any port of a secureAccess sandbox or
// under DefaultAccess token) Headers carries the access token under AccessTokenHeader;
// a signed endpoint carries its own credential and no headers. Signed endpoints
// (Expires) need an EndpointFunc that mints them (the gateway's): without one they are
// 501.
func (s *Server) Endpoint(er EndpointRequest) (Endpoint, error) {
	s.mu.Lock()
	e, ok := s.sbx[er.ID]
	var token string
	var state opensandbox.State
	var secure bool
	if ok {
		token, state, secure = e.rec.AccessToken, e.rec.Status.State, e.rec.secure()
	}
	s.mu.Unlock()
	if !ok {
		return Endpoint{}, fmt.Errorf("%w: %q", ErrNotFound, er.ID)
	}
	if state.Terminal() {
		return Endpoint{}, fmt.Errorf("%w: sandbox %s is %s", ErrInvalidState, er.ID, state)
	}
	var ep Endpoint
	switch {
	case s.cfg.Endpoint != nil:
		addr, err := s.cfg.Endpoint(er)
		if err != nil {
			return Endpoint{}, err
		}
		ep.Endpoint = addr
	case er.Expires != nil:
		return Endpoint{}, fmt.Errorf("%w: signed endpoints (expires) need the Airlock gateway", ErrNotImplemented)
	default:
		host := s.cfg.PublicAddr
		if host == "" {
			host = er.HTTP.Host
		}
		ep.Endpoint = ServerProxyEndpoint(host, er.ID, er.Port)
	}
	if token != "" && er.Expires == nil && s.portMode(secure, er.Port) == watch.Token {
		ep.Headers = map[string]string{AccessTokenHeader: token}
	}
	return ep, nil
}

// Policy returns the sandbox's egress policy document as stored (raw JSON, empty when
// the operator default applies) and its version. The egress policy API uses it.
func (s *Server) Policy(id string) (json.RawMessage, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	doc, v := s.effectiveLocked(e.rec)
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
	_, effV := s.effectiveLocked(rec)
	detach := replace && rec.PolicyName != ""
	if string(doc) == string(rec.Policy) && !detach {
		return effV, nil
	}
	old, oldV, oldName := rec.Policy, rec.PolicyVersion, rec.PolicyName
	rec.Policy = append(json.RawMessage(nil), doc...)
	if detach {
		rec.PolicyName, rec.PolicyVersion = "", effV+1
	} else {
		rec.PolicyVersion++
	}
	if err := s.commitLocked(rec); err != nil {
		rec.Policy, rec.PolicyVersion, rec.PolicyName = old, oldV, oldName
		return 0, err
	}
	_, v := s.effectiveLocked(rec)
	return v, nil
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
