package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockdev/airlock/opensandbox"
)

// pingInterval is how often a new sandbox's execd is asked /ping until it answers.
const pingInterval = 5 * time.Millisecond

// addressInterval is how often the runtime is asked for the address of a sandbox that
// has none yet (a pod being scheduled).
const addressInterval = 100 * time.Millisecond

// addressWait bounds one wait of a RunningWaiter runtime for a sandbox's address.
const addressWait = 2 * time.Second

// awaitReadyAsync moves a new sandbox from Pending to Running: once the ready gate
// (egress enforced) reports true, it polls execd /ping at addr (the container's
// address on the Airlock network, never a published port), then releases execd's
// hold (POST /_airlock/release: the user's entrypoint starts now, under the policy)
// and marks the sandbox Running; Failed after ReadyTimeout, in a lifecycle.ready span
// (a child of parent, the create's span, when valid). The probe connects only
// after enforcement, so its replies are a recorded inbound flow, never a denial.
func (s *Server) awaitReadyAsync(parent trace.SpanContext, id string, addr netip.Addr) {
	s.wg.Go(func() { s.awaitReady(parent, id, addr, opensandbox.Pending) })
}

// awaitReady is awaitReadyAsync's wait for a sandbox in state from (Pending after a
// create, Resuming after the resume of a RecreatingPauser runtime): it ends once the
// sandbox is Running (true) or Failed (ready_timeout), or when the sandbox leaves from
// or the server stops (false).
func (s *Server) awaitReady(parent trace.SpanContext, id string, addr netip.Addr, from opensandbox.State) bool {
	span := readySpan(parent, id)
	defer span.End()
	deadline := time.Now().Add(s.cfg.ReadyTimeout)
	gated := s.cfg.ReadyGate == nil
	var releaseErr error
	base := ""
	for {
		waited := false
		if !addr.IsValid() {
			// A pod has its address only once it runs (Kubernetes): ask the runtime.
			addr, waited = s.discoverAddress(id)
		}
		if addr.IsValid() && base == "" {
			base = "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(s.cfg.ExecdPort))
		}
		if base != "" && !gated {
			if gated = s.cfg.ReadyGate(id); gated {
				span.AddEvent("egress.enforced")
				s.noteEgressAttached(id)
			}
		}
		if base != "" && gated && s.pingOnce(base+"/ping") {
			if releaseErr = s.release(id, base+opensandbox.ReleasePath); releaseErr == nil {
				s.noteReleased(id)
				span.AddEvent("execd.released")
				reason := "ready"
				if from != opensandbox.Pending {
					reason = "resumed"
				}
				return s.markReady(id, from, opensandbox.Running, reason, "execd answers")
			}
		}
		if time.Now().After(deadline) {
			msg := "execd did not answer /ping within " + s.cfg.ReadyTimeout.String()
			switch {
			case base == "":
				msg = "the sandbox got no address within " + s.cfg.ReadyTimeout.String()
			case !gated:
				msg = "egress enforcement was not in place within " + s.cfg.ReadyTimeout.String()
			case releaseErr != nil:
				msg = "execd did not start the entrypoint: " + releaseErr.Error()
			}
			s.markReady(id, from, opensandbox.Failed, "ready_timeout", msg)
			span.SetStatus(codes.Error, msg)
			return false
		}
		wait := pingInterval
		switch {
		case base == "" && waited:
			wait = 0 // the runtime's wait already took its time
		case base == "":
			wait = addressInterval
		}
		select {
		case <-s.ctx.Done():
			return false
		case <-time.After(wait):
		}
		s.mu.Lock()
		e, ok := s.sbx[id]
		pending := ok && e.rec.Status.State == from
		s.mu.Unlock()
		if !ok || !pending {
			return false
		}
	}
}

// discoverAddress asks the runtime where sandbox id runs; once it has an address it is
// recorded and published (the data plane needs it before the ready gate can open).
// Invalid while the runtime has none yet. A RunningWaiter runtime is waited on (at
// most addressWait, waited true when the wait ended without an error of the runtime:
// the caller then asks again at once); others are asked once.
func (s *Server) discoverAddress(id string) (netip.Addr, bool) {
	s.mu.Lock()
	e, ok := s.sbx[id]
	cid := ""
	if ok {
		cid = e.rec.ContainerID
	}
	s.mu.Unlock()
	if !ok {
		return netip.Addr{}, false
	}
	var in Instance
	var err error
	waited := false
	if w, ok := s.rt.(RunningWaiter); ok {
		ctx, cancel := context.WithTimeout(s.ctx, addressWait)
		in, err = w.WaitRunning(ctx, cid)
		cancel()
		waited = err == nil || errors.Is(err, context.DeadlineExceeded)
	} else {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		in, err = s.rt.Inspect(ctx, cid)
		cancel()
	}
	if err != nil || !in.Address.IsValid() || in.Phase != PhaseRunning {
		return netip.Addr{}, waited && in.Phase != PhaseExited
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok = s.sbx[id]; ok {
		r := e.rec
		r.placeWorkload(in)
		if err := s.commitLocked(r); err != nil {
			s.log.Error("persisting sandbox address failed", "sandbox_id", id, "err", err)
		}
	}
	return in.Address, true
}

// release ends sandbox id's execd's hold (with its execd token). An execd that does
// not know the path (404: an image's own execd, a test stub) holds nothing.
func (s *Server) release(id, url string) error {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set(opensandbox.HeaderExecdAccessToken, s.cfg.ExecdKey.Derive(id))
	resp, err := s.ping.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}

func (s *Server) pingOnce(url string) bool {
	ctx, cancel := context.WithTimeout(s.ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := s.ping.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// markReady moves a sandbox in state from (Pending, Resuming) to state and reports
// whether it is Running now; other states are left alone.
func (s *Server) markReady(id string, from, state opensandbox.State, reason, msg string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok || e.rec.Status.State != from {
		return false
	}
	if err := s.setStatusLocked(e.rec, state, reason, msg); err != nil {
		s.log.Error("persisting sandbox status failed", "sandbox_id", id, "err", err)
	}
	if state == opensandbox.Running {
		s.log.Info("sandbox ready", "sandbox_id", id, "ready_ms", time.Since(e.rec.CreatedAt).Milliseconds())
	} else {
		s.log.Warn("sandbox failed to become ready", "sandbox_id", id, "reason", reason)
	}
	return state == opensandbox.Running
}

// reconcile rebuilds the registry from the store and the runtime's containers: adopts
// containers of known sandboxes (their state from the container's), marks sandboxes
// whose container vanished Terminated, removes containers this instance created that
// the store does not know (a create interrupted by a crash), and finishes deletions
// interrupted by a crash. Expiry needs no re-arming: the reaper reads it from records.
func (s *Server) reconcile(ctx context.Context) error {
	recs, err := allRecords(s.store)
	if err != nil {
		return err
	}
	insts, err := s.rt.List(ctx)
	if err != nil {
		return err
	}
	// Containers are matched by id: a label naming a sandbox is not enough (a second
	// container for the same sandbox can only come from an interrupted create).
	byCID := make(map[string]Instance, len(insts))
	for _, in := range insts {
		if in.Phase == PhaseRunning || in.Phase == PhasePaused {
			if full, err := s.rt.Inspect(ctx, in.ContainerID); err == nil {
				in = full // List has no pid
			}
		}
		byCID[in.ContainerID] = in
	}
	away := map[string]string{}
	for _, rec := range recs {
		if _, listed := byCID[rec.ContainerID]; !listed && rec.Pool == "" && pauseState(rec.Status.State) {
			away[rec.ID] = rec.ContainerID
		}
	}
	for cid, in := range s.pausedAway(ctx, away) {
		byCID[cid] = in
	}
	var stopping []string
	var members []*record
	memberInsts := map[string]Instance{}
	s.mu.Lock()
	for _, rec := range recs {
		if rec.Pool != "" {
			members = append(members, rec)
			if in, ok := byCID[rec.ContainerID]; ok {
				memberInsts[rec.ContainerID] = in
				delete(byCID, rec.ContainerID)
			}
			continue
		}
		if e, ok := s.sbx[rec.ID]; ok {
			// A replica that starts leading already follows every sandbox: its memory is
			// newer than the document it just read.
			rec = e.rec
		} else {
			s.sbx[rec.ID] = &entry{rec: rec}
		}
		// Every record leaves this loop persisted when it changed (commitLocked or
		// setStatusLocked below, or the put of a Terminated one).
		migrated := migrateAccess(rec)
		if migrated {
			s.log.Info("access token issued to a sandbox from an older store", "sandbox_id", rec.ID)
		}
		in, ok := byCID[rec.ContainerID]
		if ok {
			delete(byCID, rec.ContainerID)
		}
		st := rec.Status.State
		// Another replica's pause or resume may be in flight (opElsewhere): its workload
		// between states is neither vanished nor exited. Only a resumed pod already
		// running is taken up below, as an interrupted resume is (the readiness).
		if s.opElsewhere(rec) && !(ok && in.Phase == PhaseRunning && st == opensandbox.Resuming) {
			if migrated {
				if err := s.commitLocked(rec); err != nil {
					s.log.Error("persisting reconciled sandbox failed", "sandbox_id", rec.ID, "err", err)
				}
			}
			continue
		}
		switch {
		case !ok:
			if !st.Terminal() {
				_ = s.setStatusLocked(rec, opensandbox.Terminated, "container_vanished", "the container no longer exists")
			} else if !migrated {
				s.hub.Put(s.watchView(rec))
			} else if err := s.commitLocked(rec); err != nil {
				s.log.Error("persisting reconciled sandbox failed", "sandbox_id", rec.ID, "err", err)
			}
			continue
		case st == opensandbox.Stopping:
			stopping = append(stopping, rec.ID)
		}
		rec.Address, rec.Address6, rec.Pid, rec.Node = in.Address, in.Address6, in.Pid, in.Node
		switch in.Phase {
		case PhaseRunning:
			switch st {
			case opensandbox.Pending:
				s.awaitReadyAsync(trace.SpanContext{}, rec.ID, in.Address)
			case opensandbox.Running:
				if rec.Claiming {
					s.confirmClaimAsync(rec.ID, in.Address)
				}
			case opensandbox.Resuming:
				if _, ok := s.rt.(RecreatingPauser); ok {
					// A resume interrupted after its pod was made: the pod's execd is
					// held until the create's readiness releases it.
					s.wg.Go(func() { s.awaitReady(trace.SpanContext{}, rec.ID, in.Address, opensandbox.Resuming) })
					break
				}
				_ = s.setStatusLocked(rec, opensandbox.Running, "reconciled", "the container is running")
				continue
			case opensandbox.Pausing, opensandbox.Paused:
				_ = s.setStatusLocked(rec, opensandbox.Running, "reconciled", "the container is running")
				continue
			}
		case PhasePaused:
			if st != opensandbox.Paused && st != opensandbox.Stopping && !st.Terminal() {
				_ = s.setStatusLocked(rec, opensandbox.Paused, "reconciled", "the container is paused")
				continue
			}
		default:
			if !st.Terminal() && st != opensandbox.Stopping {
				_ = s.setStatusLocked(rec, opensandbox.Failed, "container_exited", "the container is not running")
				continue
			}
		}
		if err := s.commitLocked(rec); err != nil {
			s.log.Error("persisting reconciled sandbox failed", "sandbox_id", rec.ID, "err", err)
		}
	}
	s.mu.Unlock()
	s.adoptMembers(members, memberInsts)
	if _, shared := s.store.(SharedStore); !shared {
		// With replicas, a container the store does not know yet may be another
		// replica's create in flight: only a single server removes orphans.
		for _, in := range byCID {
			s.removeOrphan(ctx, in)
		}
	}
	for _, id := range stopping {
		s.wg.Go(func() {
			if err := s.Delete(s.ctx, id, "user_delete"); err != nil {
				s.log.Error("finishing an interrupted delete failed", "sandbox_id", id, "err", err)
			}
		})
	}
	s.log.Info("registry reconciled", "sandboxes", len(recs), "containers", len(insts))
	return nil
}

func (s *Server) removeOrphan(ctx context.Context, in Instance) {
	if err := s.rt.Remove(ctx, in); err != nil {
		s.log.Error("removing orphan container failed", "container_id", short(in.ContainerID), "err", err)
		return
	}
	s.metrics.orphans.Inc()
	s.log.Info("orphan container removed", "container_id", short(in.ContainerID), "sandbox_id", in.SandboxID)
}

// reapLoop deletes expired sandboxes every ReapInterval, compares the registry with
// the runtime every ResyncInterval, and forgets vanished sandboxes after
// TerminatedRetention.
func (s *Server) reapLoop(ctx context.Context) {
	reap := time.NewTicker(s.cfg.ReapInterval)
	defer reap.Stop()
	resync := time.NewTicker(s.cfg.ResyncInterval)
	defer resync.Stop()
	var (
		mu      sync.Mutex
		reaping = map[string]bool{}
		sem     = make(chan struct{}, 8)
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			s.resync()
			s.purge()
		case now := <-reap.C:
			var due []string
			s.mu.Lock()
			for id, e := range s.sbx {
				r := e.rec
				if r.ExpiresAt != nil && !r.ExpiresAt.After(now) && r.Status.State != opensandbox.Stopping {
					due = append(due, id)
				}
			}
			s.mu.Unlock()
			for _, id := range due {
				mu.Lock()
				busy := reaping[id]
				reaping[id] = true
				mu.Unlock()
				if busy {
					continue
				}
				s.wg.Go(func() {
					sem <- struct{}{}
					defer func() {
						<-sem
						mu.Lock()
						delete(reaping, id)
						mu.Unlock()
					}()
					if err := s.Delete(s.ctx, id, "ttl_expiry"); err != nil {
						s.log.Error("reaping expired sandbox failed", "sandbox_id", id, "err", err)
						return
					}
					s.metrics.reaped.Inc()
				})
			}
		}
	}
}

// opElsewhere reports whether rec may be in the middle of another replica's pause or
// resume: with a SharedStore, Pausing or Resuming for less than such an operation can
// last (createTimeout, then the readiness). The operation lock only guards this
// replica's own; meanwhile the workload is between states (a resumed pod not started
// yet, a paused one going), which reconcile and resync must not take for an exited or
// vanished container. A replica that died mid-operation leaves the state to them once
// that time is past. A single server makes every change itself: never. s.mu is held.
func (s *Server) opElsewhere(rec *record) bool {
	if _, shared := s.store.(SharedStore); !shared {
		return false
	}
	st := rec.Status.State
	return (st == opensandbox.Pausing || st == opensandbox.Resuming) &&
		time.Since(rec.Status.LastTransitionAt) < createTimeout+s.cfg.ReadyTimeout
}

// resync marks sandboxes whose container vanished Terminated and those whose container
// exited Failed, and follows pauses done outside Airlock. Sandboxes busy with an
// operation are skipped this round.
func (s *Server) resync() {
	s.mu.Lock()
	before := make(map[string]*entry, len(s.sbx))
	pausing := map[string]string{} // sandbox id → container id
	for id, e := range s.sbx {
		before[id] = e
		if pauseState(e.rec.Status.State) {
			pausing[id] = e.rec.ContainerID
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	insts, err := s.rt.List(ctx)
	if err != nil {
		s.log.Warn("listing containers failed", "err", err)
		return
	}
	byID := make(map[string]Instance, len(insts))
	for _, in := range insts {
		byID[in.SandboxID] = in
		delete(pausing, in.SandboxID)
	}
	for _, in := range s.pausedAway(ctx, pausing) {
		byID[in.SandboxID] = in
	}
	for id, e := range before {
		if !e.op.TryLock() {
			continue
		}
		s.mu.Lock()
		rec := e.rec
		st := rec.Status.State
		in, ok := byID[id]
		if ok && in.ContainerID != rec.ContainerID {
			ok = false
		}
		switch {
		case st.Terminal() || st == opensandbox.Stopping:
		case s.sbx[id] != e:
		case s.opElsewhere(rec):
		case !ok:
			_ = s.setStatusLocked(rec, opensandbox.Terminated, "container_vanished", "the container no longer exists")
			s.log.Warn("sandbox container vanished", "sandbox_id", id)
		case in.Phase == PhaseExited || (in.Phase == PhaseCreated && st != opensandbox.Pending):
			// A Pending sandbox's pod may wait to be scheduled (Kubernetes): only
			// readiness times it out.
			_ = s.setStatusLocked(rec, opensandbox.Failed, "container_exited", "the container stopped")
			s.log.Warn("sandbox container exited", "sandbox_id", id)
		case in.Phase == PhasePaused && st == opensandbox.Running:
			_ = s.setStatusLocked(rec, opensandbox.Paused, "paused_externally", "the container was paused outside Airlock")
		case in.Phase == PhaseRunning && st == opensandbox.Paused:
			_ = s.setStatusLocked(rec, opensandbox.Running, "resumed_externally", "the container was resumed outside Airlock")
		}
		s.mu.Unlock()
		e.op.Unlock()
	}
	s.repairEgress(ctx)
}

// repairEgress rewrites the second layer of live sandboxes whose layer went missing
// (EgressRepairer), so a NetworkPolicy deleted by hand is back within a resync.
func (s *Server) repairEgress(ctx context.Context) {
	rp, ok := s.rt.(EgressRepairer)
	if !ok {
		return
	}
	var ids []string
	s.mu.Lock()
	for id, e := range s.sbx {
		// Running only: a Pending sandbox's NetworkPolicy may not be made yet.
		if e.rec.Status.State == opensandbox.Running {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	missing, err := rp.MissingEgress(ctx, ids)
	if err != nil {
		s.log.Warn("checking the sandboxes' second network layer failed", "err", err)
		return
	}
	for _, id := range missing {
		s.mu.Lock()
		e, found := s.sbx[id]
		s.mu.Unlock()
		if !found || !e.op.TryLock() {
			continue
		}
		s.log.Warn("sandbox's second network layer was missing: rewriting it", "sandbox_id", id)
		s.updateEgressOf(ctx, e.rec)
		e.op.Unlock()
	}
}

// purge forgets sandboxes that have been Terminated or Failed for longer than
// TerminatedRetention, removing what is left of their containers.
func (s *Server) purge() {
	cutoff := time.Now().Add(-s.cfg.TerminatedRetention)
	var old []string
	s.mu.Lock()
	for id, e := range s.sbx {
		if e.rec.Status.State.Terminal() && e.rec.Status.LastTransitionAt.Before(cutoff) {
			old = append(old, id)
		}
	}
	s.mu.Unlock()
	for _, id := range old {
		if err := s.Delete(s.ctx, id, "retention"); err != nil {
			s.log.Warn("purging terminated sandbox failed", "sandbox_id", id, "err", err)
		}
	}
}
