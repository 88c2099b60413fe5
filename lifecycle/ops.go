package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// createTimeout bounds a create's runtime work (an image pull included), independent of
// the client's connection: a client that hangs up never leaves a half-made sandbox.
const createTimeout = 10 * time.Minute

// Create validates req, creates and starts the sandbox's container and answers with
// the new sandbox in state Pending; it becomes Running once execd answers /ping. On
// error nothing is left behind.
func (s *Server) Create(ctx context.Context, req *CreateRequest) (Sandbox, error) {
	ctx, span := tracer.Start(ctx, "lifecycle.create")
	sb, err := s.create(ctx, req)
	if err == nil {
		span.SetAttributes(attribute.String(attrSandbox, sb.ID))
	}
	endSpan(span, err)
	return sb, err
}

func (s *Server) create(ctx context.Context, req *CreateRequest) (Sandbox, error) {
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
	if err := s.checkRuntime(ctx, v.spec.OCIRuntime); err != nil {
		return Sandbox{}, err
	}
	policyName := req.Extensions[ExtPolicy]
	var snap *snapshotRecord
	var pin *policyPin // the snapshot's named policy at its captured version
	if req.SnapshotID != "" {
		sn, err := s.snapshotFor(ctx, req.SnapshotID)
		if err != nil {
			return Sandbox{}, err
		}
		snap = &sn
		restoreSpec(v, &sn, policyName)
		if policyName == "" && len(req.NetworkPolicy) == 0 {
			policyName, pin = sn.Source.PolicyName, restorePin(&sn)
		}
	}
	if policyName == "" && len(v.policy) == 0 && snap == nil {
		policyName = s.cfg.DefaultPolicy
	}
	// A policy with HTTP rules has HTTPS to those hosts intercepted with the sandbox's
	// CA (egressd's L7 proxy), so the sandbox must trust it, as with credentialProxy.
	httpRules := policyHasHTTP(v.policy)
	if policyName != "" {
		np, err := s.lib.named(policyName, false)
		if err != nil {
			return Sandbox{}, err
		}
		if pin != nil {
			httpRules = httpRules || pinHasHTTP(pin)
		} else {
			httpRules = httpRules || np.Policy.HasHTTP()
		}
	}
	asked := v.spec.Image
	if local, ok := s.cfg.ImageAliases[asked]; ok && snap == nil {
		v.spec.Image = local
	}
	if snap != nil {
		asked = snap.Source.Image // what the source asked for; the sandbox reports snapshotId
	}
	id := newSandboxID()
	v.spec.SandboxID = id
	v.spec.Hold = true // released by awaitReadyAsync once enforced
	if httpRules && !v.credentialProxy && s.cfg.CredentialVault == nil {
		return Sandbox{}, fmt.Errorf("%w: the policy has HTTP rules, which need TLS interception with the sandbox's CA, and this server runs no Credential Vault to hold it", ErrInvalidRequest)
	}
	if v.credentialProxy || httpRules {
		if s.cfg.CredentialVault == nil {
			return Sandbox{}, fmt.Errorf("%w: credentialProxy is not available: this server runs no Credential Vault", ErrInvalidRequest)
		}
		_, _, ca, err := s.cfg.CredentialVault.CA(id)
		if err != nil {
			return Sandbox{}, fmt.Errorf("credential proxy CA for %s: %w", id, err)
		}
		v.spec.TrustedCAPEM = ca
		if vc := s.vaultCopier(); snap != nil && snap.Source.Vault && vc != nil {
			// The snapshot's credentials and bindings, re-bound before anything runs.
			if err := vc.CopyVault(snap.ID, id); err != nil {
				s.forgetVault(id)
				return Sandbox{}, fmt.Errorf("re-binding the credential vault of snapshot %s: %w", snap.ID, err)
			}
		}
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
		PinnedPolicy:    pin,
		RenewOnAccess:   v.renewOnAccess,
		CredentialProxy: v.credentialProxy,
		Owner:           principal.IDFromContext(ctx),
		traceParent:     traceParent(ctx),
	}
	if snap != nil {
		rec.SnapshotID = snap.ID
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
	created := "sandbox created: image " + asked
	if snap != nil {
		created = "sandbox restored from snapshot " + snap.ID + " of sandbox " + snap.SandboxID
	} else if asked != v.spec.Image {
		created += " (served by the local image " + v.spec.Image + ")"
	}
	addEventLocked(rec, EventLifecycle, EventNormal, "Created", fmt.Sprintf("%s, entrypoint %q", created, v.spec.Entrypoint))
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
	s.mu.Lock()
	s.policyEventLocked(rec, "at create")
	s.mu.Unlock()
	v.spec.ExecdToken = s.cfg.ExecdKey.Derive(id)
	rtctx, rtspan := tracer.Start(rctx, "runtime.create", trace.WithAttributes(attribute.String(attrSandbox, id),
		attribute.String("airlock.runtime", s.rt.Kind())))
	inst, err := s.rt.Create(rtctx, v.spec)
	endSpan(rtspan, err)
	if err != nil && asked != v.spec.Image && errors.Is(err, ErrImageUnavailable) {
		err = fmt.Errorf("%w (this server serves %s from the local image %s: images.aliases)", err, asked, v.spec.Image)
	}
	if err != nil {
		s.forgetVault(id)
		s.metrics.creates.WithLabelValues("error").Inc()
		return Sandbox{}, err
	}
	rec.ContainerID, rec.DeleteVolumes = inst.ContainerID, inst.DeleteVolumes
	rec.placeWorkload(inst)

	s.mu.Lock()
	addEventLocked(rec, EventLifecycle, EventNormal, "ContainerCreated", fmt.Sprintf("%s runtime: container %s made in %d ms",
		s.rt.Kind(), short(inst.ContainerID), time.Since(start).Milliseconds()))
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
	s.awaitReadyAsync(trace.SpanContextFromContext(ctx), id, rec.Address)
	return out, nil
}

func short(cid string) string {
	if len(cid) > 12 {
		return cid[:12]
	}
	return cid
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
	s.proxy.forget()
	s.metrics.transition(opensandbox.Terminated)
	s.log.Info("sandbox removed", "sandbox_id", id, "reason", reason)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Pause freezes a Running sandbox (409 otherwise); on a RecreatingPauser runtime it
// captures the sandbox and removes its workload instead (pauserecreate.go).
func (s *Server) Pause(ctx context.Context, id string) error {
	if rp, ok := s.rt.(RecreatingPauser); ok {
		return s.pauseRecreating(ctx, id, rp)
	}
	return s.transition(ctx, id, opensandbox.Running, opensandbox.Pausing, opensandbox.Paused, "paused", s.rt.Pause)
}

// Resume thaws a Paused sandbox (409 otherwise); on a RecreatingPauser runtime it
// makes the workload again and waits for the create's readiness.
func (s *Server) Resume(ctx context.Context, id string) error {
	if rp, ok := s.rt.(RecreatingPauser); ok {
		return s.resumeRecreating(ctx, id, rp)
	}
	return s.transition(ctx, id, opensandbox.Paused, opensandbox.Resuming, opensandbox.Running, "resumed", s.rt.Resume)
}

func (s *Server) transition(ctx context.Context, id string, from, via, to opensandbox.State, reason string, do func(context.Context, string) error) error {
	e, err := s.lockOp(id)
	if err != nil {
		return err
	}
	defer e.op.Unlock()
	if pc, ok := s.rt.(PauseChecker); ok {
		if err := pc.CanPause(); err != nil {
			return err
		}
	}
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
