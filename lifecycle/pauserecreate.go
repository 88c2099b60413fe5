package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlockdev/airlock/opensandbox"
)

// Pause and resume on a RecreatingPauser runtime (Kubernetes). The sandbox keeps its
// record, policy (a PUT while paused is enforced at resume), vault, expiry and
// access token throughout; only its workload goes away and comes back.

// pauseRecreating moves Running sandbox id through Pausing to Paused with rp.Pause
// (the capture, then the workload's removal); the record then drops the workload's
// addresses, so the data plane detaches it. A failed Pause leaves it Running
// (runtime_error), the runtime having undone what it did.
func (s *Server) pauseRecreating(ctx context.Context, id string, rp RecreatingPauser) error {
	e, cid, err := s.beginRecreate(id, rp, opensandbox.Running, opensandbox.Pausing, "paused")
	if err != nil {
		return err
	}
	defer e.op.Unlock()
	start := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
	defer cancel()
	if err := rp.Pause(rctx, cid); err != nil {
		s.setStatus(e.rec, opensandbox.Running, "runtime_error", err.Error())
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	r := e.rec
	r.Address, r.Address6, r.Pid, r.PodUID, r.HostInterface, r.HostIP = netip.Addr{}, netip.Addr{}, 0, "", "", ""
	err = s.setStatusLocked(r, opensandbox.Paused, "paused", "the sandbox's filesystem is kept on its node; its workload is removed until resume")
	s.mu.Unlock()
	s.log.Info("sandbox paused", "sandbox_id", id, "runtime", rp.Kind(), "pause_ms", time.Since(start).Milliseconds())
	return err
}

// resumeRecreating moves Paused sandbox id through Resuming to Running: rp.Resume
// makes its workload again, then the create's readiness (awaitReady) releases it under
// the current policy. A failed Resume or readiness leaves it Failed (resume_failed,
// ready_timeout) with the reason in its message; the workload's execd stays held, so
// nothing of the user runs unenforced.
func (s *Server) resumeRecreating(ctx context.Context, id string, rp RecreatingPauser) error {
	e, cid, err := s.beginRecreate(id, rp, opensandbox.Paused, opensandbox.Resuming, "resuming")
	if err != nil {
		return err
	}
	defer e.op.Unlock()
	start := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer cancel()
	if err := rp.Resume(rctx, cid); err != nil {
		s.setStatus(e.rec, opensandbox.Failed, "resume_failed", err.Error())
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if !s.awaitReady(trace.SpanContextFromContext(ctx), id, netip.Addr{}, opensandbox.Resuming) {
		s.mu.Lock()
		st := e.rec.Status
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s did not come back: %s (%s: %s)", id, st.State, st.Reason, st.Message)
	}
	s.mu.Lock()
	inst := Instance{SandboxID: id, ContainerID: e.rec.ContainerID, Node: e.rec.Node}
	s.mu.Unlock()
	if err := rp.Resumed(rctx, inst); err != nil {
		s.log.Warn("the runtime could not note a resume", "sandbox_id", id, "err", err)
	}
	s.log.Info("sandbox resumed", "sandbox_id", id, "runtime", rp.Kind(), "resume_ms", time.Since(start).Milliseconds())
	return nil
}

// beginRecreate takes sandbox id's operation lock (the caller unlocks it), checks that
// the runtime can pause (PauseChecker) and that the sandbox is in from, and moves it to
// via; it returns the entry and its container id.
func (s *Server) beginRecreate(id string, rt Runtime, from, via opensandbox.State, reason string) (*entry, string, error) {
	e, err := s.lockOp(id)
	if err != nil {
		return nil, "", err
	}
	if pc, ok := rt.(PauseChecker); ok {
		if err := pc.CanPause(); err != nil {
			e.op.Unlock()
			return nil, "", err
		}
	}
	s.mu.Lock()
	cur, cid := e.rec.Status.State, e.rec.ContainerID
	s.mu.Unlock()
	if cur != from {
		e.op.Unlock()
		return nil, "", fmt.Errorf("%w: sandbox %s is %s; this needs %s", ErrInvalidState, id, cur, from)
	}
	s.setStatus(e.rec, via, reason, "")
	return e, cid, nil
}

// pausedAway asks a RecreatingPauser runtime (Inspect) about the sandboxes of cids
// (sandbox id → container id: the Pausing, Paused or Resuming ones its List did not
// name, since a paused sandbox has no workload to list) and returns those it reports
// paused, by container id. Other runtimes: none. s.mu must not be held.
func (s *Server) pausedAway(ctx context.Context, cids map[string]string) map[string]Instance {
	out := map[string]Instance{}
	if _, ok := s.rt.(RecreatingPauser); !ok {
		return out
	}
	for id, cid := range cids {
		in, err := s.rt.Inspect(ctx, cid)
		if err != nil {
			if !errors.Is(err, ErrInstanceGone) {
				s.log.Warn("inspecting a paused sandbox failed", "sandbox_id", id, "err", err)
			}
			continue
		}
		if in.Phase == PhasePaused {
			out[cid] = in
		}
	}
	return out
}

// pauseState reports whether st is a state in which a RecreatingPauser's sandbox may
// have no workload.
func pauseState(st opensandbox.State) bool {
	return st == opensandbox.Pausing || st == opensandbox.Paused || st == opensandbox.Resuming
}
