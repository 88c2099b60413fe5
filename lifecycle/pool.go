package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// PoolSpec declares a warm pool: Size sandboxes of Image with ResourceLimits are
// created ahead of any request, held (execd --hold: nothing of the user has run) and
// enforced with deny-all egress, invisible to the API and given no routes. A create
// request for the same image (after ImageAliases) and the same limits, without volumes
// or credentialProxy, claims one instead of starting a container: its policy, env,
// entrypoint, metadata and expiry are applied at claim, and the pool is replenished in
// the background.
type PoolSpec struct {
	// Name identifies the pool in metrics and logs; default the image.
	Name string
	// Image is the image members run; an alias is resolved like a request's.
	Image string
	// Size is how many members are kept ready (1 to 256).
	Size int
	// ResourceLimits are the members' limits in create-request form ({"cpu": "500m",
	// "memory": "512Mi"}); a request matches only with the same limits.
	ResourceLimits map[string]string
	// Entrypoint, when set, is started in every member as soon as it is warm, under
	// its deny-all policy and with the server's default env only (a browser image's
	// Chromium is up before any claim). Such a pool serves only creates that ask for
	// exactly this entrypoint and add no env: a claim then only applies the request's
	// policy and identity, and releases nothing.
	Entrypoint []string
	// ReadyPort, with Entrypoint, is a TCP port the entrypoint listens on inside the
	// sandbox (9222 for airlock/browser's DevTools): a member is claimable only once it
	// accepts a connection there, so a claim finds the service up. 0: claimable once
	// the entrypoint started.
	ReadyPort int
	// ReadyPath, with ReadyPort, makes readiness an HTTP GET of this path on that port
	// answering 2xx (airlock/browser: /json/version, which a starting Chromium answers
	// only once it can serve DevTools), rather than a TCP connect.
	ReadyPath string
}

// poolDenyAll is a member's policy until it is claimed: nothing leaves it.
var poolDenyAll = json.RawMessage(`{"defaultAction":"deny","egress":[]}`)

// pool is one warm pool; its fields but spec and kick are guarded by Server.mu.
type pool struct {
	spec  PoolSpec
	image string // resolved
	nano  int64
	mem   int64
	pids  int64
	ready []*record // claimable members, oldest first
	// warming counts members being created or waiting for enforcement.
	warming int
	kick    chan struct{}
}

// newPools checks the pool declarations against l and the aliases.
func newPools(specs []PoolSpec, l Limits, aliases map[string]string) ([]*pool, error) {
	var out []*pool
	names := map[string]bool{}
	for i, ps := range specs {
		if ps.Image == "" {
			return nil, fmt.Errorf("lifecycle: pools[%d]: image is required", i)
		}
		if ps.Size < 1 || ps.Size > 256 {
			return nil, fmt.Errorf("lifecycle: pools[%d] (%s): size %d is outside [1, 256]", i, ps.Image, ps.Size)
		}
		if ps.Name == "" {
			ps.Name = ps.Image
		}
		if ps.ReadyPort != 0 && (ps.Entrypoint == nil || ps.ReadyPort < 1 || ps.ReadyPort > 65535) {
			return nil, fmt.Errorf("lifecycle: pools[%d] (%s): readyPort %d needs an entrypoint and a port in [1, 65535]", i, ps.Name, ps.ReadyPort)
		}
		if ps.ReadyPath != "" && (ps.ReadyPort == 0 || !strings.HasPrefix(ps.ReadyPath, "/")) {
			return nil, fmt.Errorf("lifecycle: pools[%d] (%s): readyPath %q needs readyPort and must start with /", i, ps.Name, ps.ReadyPath)
		}
		if names[ps.Name] {
			return nil, fmt.Errorf("lifecycle: pools[%d]: a second pool named %q (give each a name)", i, ps.Name)
		}
		names[ps.Name] = true
		spec := Spec{Pids: l.DefaultPids}
		if err := validateResources(ps.ResourceLimits, l, &spec); err != nil {
			return nil, fmt.Errorf("lifecycle: pools[%d] (%s): %w", i, ps.Name, err)
		}
		img := ps.Image
		if local, ok := aliases[img]; ok {
			img = local
		}
		ps.ResourceLimits = maps.Clone(ps.ResourceLimits)
		out = append(out, &pool{spec: ps, image: img, nano: spec.NanoCPUs, mem: spec.MemoryBytes, pids: spec.Pids,
			kick: make(chan struct{}, 1)})
	}
	return out, nil
}

// poolFor returns the pool a validated create can be served from, or nil.
func (s *Server) poolFor(v *validated) *pool {
	if len(v.spec.Volumes) > 0 || v.credentialProxy || len(v.spec.TrustedCAPEM) > 0 || v.spec.OCIRuntime != "" {
		return nil // members run under the default OCI runtime
	}
	for _, p := range s.pools {
		if p.image != v.spec.Image || p.nano != v.spec.NanoCPUs || p.mem != v.spec.MemoryBytes || p.pids != v.spec.Pids {
			continue
		}
		if p.spec.Entrypoint != nil && (!slices.Equal(p.spec.Entrypoint, v.spec.Entrypoint) || len(v.spec.Env) > 0) {
			continue // its members run their entrypoint already, with no env of a request
		}
		return p
	}
	return nil
}

func (p *pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// claim serves a create from p: it takes a ready member, gives it rec's identity-free
// settings (policy, metadata, expiry, access), waits until the data plane enforces the
// new policy, releases execd with env and entrypoint, and returns the sandbox Running.
// ok is false when the pool had no member or the claimed one failed (it is removed);
// the caller then creates cold.
func (s *Server) claim(ctx context.Context, p *pool, v *validated, want *record) (Sandbox, bool) {
	s.mu.Lock()
	if len(p.ready) == 0 {
		s.mu.Unlock()
		s.metrics.poolMisses.WithLabelValues(p.spec.Name).Inc()
		p.wake()
		return Sandbox{}, false
	}
	m := p.ready[0]
	p.ready = p.ready[1:]
	s.mu.Unlock()
	p.wake()

	rec := want.clone()
	rec.ID, rec.ContainerID, rec.Address, rec.Address6, rec.Pid = m.ID, m.ContainerID, m.Address, m.Address6, m.Pid
	rec.PodUID, rec.Node, rec.HostInterface, rec.HostIP = m.PodUID, m.Node, m.HostInterface, m.HostIP
	rec.PolicyVersion = m.PolicyVersion + 1 // above the member's deny-all, named or not
	began := time.Now()
	s.mu.Lock()
	s.policyEventLocked(rec, "at create, on a warm pool member")
	// One store write: the request's policy, and Running marked Claiming. The data
	// plane learns the policy from the publication before it (a node following
	// another replica, from the store), so the enforcement wait and the runtime's
	// second layer (a NetworkPolicy on Kubernetes) run while the store writes; the
	// release waits for all three. A gateway may route to the sandbox at once: execd
	// holds every request until the release. The claim answers without a second
	// write: the stored mark tells a leader that starts later to ask execd whether the
	// release happened (confirmClaimAsync). Should the write fail, the member is
	// dropped (its container removed) and nothing of the request ran in it.
	rec.Status = Status{} // the member's warming status is not the sandbox's history
	rec.Claiming = true
	s.applyStatusLocked(rec, opensandbox.Running, "ready", "claimed from warm pool "+p.spec.Name)
	s.hub.Put(s.watchView(rec))
	_, version := s.lib.effective(rec)
	var enforced, second time.Duration
	enforcedErr, secondDone := make(chan error, 1), make(chan struct{})
	wctx, stopWait := context.WithCancel(ctx) // a failed write ends the wait at once
	defer stopWait()
	go func() {
		t := time.Now()
		err := s.awaitEnforced(wctx, rec.ID, version)
		enforced = time.Since(t)
		enforcedErr <- err
	}()
	update := s.egressUpdateLocked(rec)
	go func() {
		defer close(secondDone)
		t := time.Now()
		update(ctx)
		second = time.Since(t)
	}()
	err := s.commitLocked(rec)
	s.mu.Unlock()
	stored := time.Since(began)
	if err != nil {
		stopWait()
	}
	if eerr := <-enforcedErr; err == nil {
		err = eerr
	}
	<-secondDone
	t := time.Now()
	if err == nil && p.spec.Entrypoint == nil {
		err = s.releaseWith(rec.ID, rec.Address, opensandbox.Release{Env: s.releaseEnv(v.spec.Env), Entrypoint: v.spec.Entrypoint})
	}
	released := time.Since(t)
	if err != nil {
		s.log.Warn("warm pool member failed at claim; serving the create cold", "pool", p.spec.Name, "sandbox_id", rec.ID, "err", err)
		s.dropMember(rec)
		return Sandbox{}, false
	}
	s.mu.Lock()
	// In memory only: the next write of the record (renew, policy, state, delete)
	// stores the mark cleared and these events.
	rec.Claiming = false
	addEventLocked(rec, EventLifecycle, EventNormal, "ClaimedFromPool", fmt.Sprintf(
		"warm pool %s: member %s claimed (ms: stored %d; enforced %d and second layer %d, both alongside the write; released %d)",
		p.spec.Name, m.ID, stored.Milliseconds(), enforced.Milliseconds(), second.Milliseconds(), released.Milliseconds()))
	if s.cfg.PolicyGate != nil {
		addEventLocked(rec, EventNetwork, EventNormal, "EgressAttached", fmt.Sprintf("the data plane enforces policy version %d", version))
	}
	if p.spec.Entrypoint == nil {
		addEventLocked(rec, EventLifecycle, EventNormal, "Released", "execd started the entrypoint")
	} else {
		addEventLocked(rec, EventLifecycle, EventNormal, "Released", "the entrypoint started when the member warmed, under its deny-all policy")
	}
	s.sbx[rec.ID] = &entry{rec: rec}
	out := rec.view(false)
	s.mu.Unlock()
	s.metrics.poolClaims.WithLabelValues(p.spec.Name).Inc()
	return out, true
}

// awaitEnforced waits until PolicyGate confirms version v of id (no gate: at once),
// at most PolicyApplyTimeout.
func (s *Server) awaitEnforced(ctx context.Context, id string, v uint64) error {
	if s.cfg.PolicyGate == nil {
		return nil
	}
	deadline := time.Now().Add(s.cfg.PolicyApplyTimeout)
	for !s.cfg.PolicyGate(id, v) {
		if time.Now().After(deadline) {
			return fmt.Errorf("policy version %d not confirmed enforced within %s", v, s.cfg.PolicyApplyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// releaseWith releases held sandbox id's execd at addr with rel.
func (s *Server) releaseWith(id string, addr interface{ String() string }, rel opensandbox.Release) error {
	body, err := json.Marshal(rel)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(s.cfg.ExecdPort)) + opensandbox.ReleasePath
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.HeaderExecdAccessToken, s.cfg.ExecdKey.Derive(id))
	resp, err := s.ping.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("execd release answered %s", resp.Status)
	}
	return nil
}

// dropMember forgets a member (or a failed claim) and removes its container in the
// background.
func (s *Server) dropMember(rec *record) {
	s.mu.Lock()
	err := s.store.DeleteSandbox(rec.ID)
	s.mu.Unlock()
	if err != nil {
		s.log.Error("forgetting a warm pool member failed", "sandbox_id", rec.ID, "err", err)
	}
	s.hub.Delete(rec.ID)
	inst := Instance{SandboxID: rec.ID, ContainerID: rec.ContainerID}
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 2*time.Minute)
		defer cancel()
		if err := s.rt.Remove(ctx, inst); err != nil {
			s.log.Error("removing a warm pool member failed", "sandbox_id", rec.ID, "err", err)
		}
	})
}

// poolLoop keeps p at its size until ctx ends (the server stops, or a replica loses
// the lead): one member is created at a time, so replenishing never takes more than one
// core from the sandboxes in use.
func (s *Server) poolLoop(ctx context.Context, p *pool) {
	for {
		s.mu.Lock()
		need := p.spec.Size - len(p.ready) - p.warming
		if need > 0 {
			p.warming++
		}
		s.mu.Unlock()
		if need <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.kick:
			}
			continue
		}
		start := time.Now()
		rec, err := s.warmOne(ctx, p)
		s.mu.Lock()
		p.warming--
		if err == nil {
			p.ready = append(p.ready, rec)
		}
		s.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("creating a warm pool member failed", "pool", p.spec.Name, "err", err)
			select { // do not spin against a broken engine
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			continue
		}
		s.metrics.poolReplenish.WithLabelValues(p.spec.Name).Observe(time.Since(start).Seconds())
	}
}

// warmOne creates one member of p and waits until it is enforced and its execd answers.
func (s *Server) warmOne(ctx context.Context, p *pool) (*record, error) {
	id := newSandboxID()
	ctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	inst, err := s.rt.Create(ctx, Spec{
		SandboxID: id, Image: p.image, Entrypoint: []string{"tail", "-f", "/dev/null"}, Env: map[string]string{},
		NanoCPUs: p.nano, MemoryBytes: p.mem, Pids: p.pids, Hold: true, ExecdToken: s.cfg.ExecdKey.Derive(id),
	})
	if err != nil {
		return nil, err
	}
	no := false
	rec := &record{
		ID: id, Pool: p.spec.Name, Node: inst.Node, ContainerID: inst.ContainerID, Image: p.image,
		Entrypoint: []string{"tail", "-f", "/dev/null"}, Metadata: map[string]string{},
		ResourceLimits: maps.Clone(p.spec.ResourceLimits), CreatedAt: time.Now().UTC(),
		Policy: poolDenyAll, PolicyVersion: 1, AccessToken: newAccessToken(), SecureAccess: &no,
		Address: inst.Address, Address6: inst.Address6, Pid: inst.Pid, DeleteVolumes: inst.DeleteVolumes,
		Status: Status{State: opensandbox.Pending, Reason: "warming", Message: "warm pool member", LastTransitionAt: time.Now().UTC()},
	}
	s.mu.Lock()
	err = s.commitLocked(rec)
	s.mu.Unlock()
	if err == nil {
		err = s.awaitMember(ctx, rec)
	}
	if err == nil && p.spec.Entrypoint != nil {
		err = s.releaseWith(rec.ID, rec.Address, opensandbox.Release{Env: s.releaseEnv(nil), Entrypoint: p.spec.Entrypoint})
		if err == nil {
			s.mu.Lock()
			rec.Entrypoint = slices.Clone(p.spec.Entrypoint)
			s.mu.Unlock()
			if p.spec.ReadyPort > 0 {
				err = awaitReady(ctx, net.JoinHostPort(rec.Address.String(), strconv.Itoa(p.spec.ReadyPort)), p.spec.ReadyPath, s.cfg.ReadyTimeout)
			}
		}
	}
	if err != nil {
		s.dropMember(rec)
		return nil, err
	}
	return rec, nil
}

// awaitMember waits until the member has an address (a pod has one once it runs:
// recorded and published, since the data plane needs it), the data plane enforces its
// deny-all policy and its (held) execd answers /ping.
func (s *Server) awaitMember(ctx context.Context, rec *record) error {
	base := ""
	deadline := time.Now().Add(s.cfg.ReadyTimeout)
	for {
		if base == "" && s.memberAddress(ctx, rec) {
			base = "http://" + net.JoinHostPort(rec.Address.String(), strconv.Itoa(s.cfg.ExecdPort))
		}
		if base != "" && (s.cfg.ReadyGate == nil || s.cfg.ReadyGate(rec.ID)) && s.pingOnce(base+"/ping") {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("not enforced and answering within " + s.cfg.ReadyTimeout.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pingInterval):
		}
	}
}

// memberAddress reports whether member rec has an address, asking the runtime when
// the create returned none (Kubernetes) and then recording and publishing where it
// runs (address, node, pod UID).
func (s *Server) memberAddress(ctx context.Context, rec *record) bool {
	s.mu.Lock()
	known := rec.Address.IsValid()
	s.mu.Unlock()
	if known {
		return true
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	in, err := s.rt.Inspect(ictx, rec.ContainerID)
	if err != nil || !in.Address.IsValid() || in.Phase != PhaseRunning {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.placeWorkload(in)
	if err := s.commitLocked(rec); err != nil {
		s.log.Error("persisting a warm pool member's address failed", "sandbox_id", rec.ID, "err", err)
	}
	return true
}

// adoptMembers takes members found at start back into their pools (oldest first, up to
// each pool's size, after they answer again) and drops the rest: members of pools no
// longer declared, or whose container is gone or not running.
func (s *Server) adoptMembers(members []*record, running map[string]Instance) {
	byName := map[string]*pool{}
	for _, p := range s.pools {
		byName[p.spec.Name] = p
	}
	slices.SortFunc(members, func(a, b *record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for _, rec := range members {
		p := byName[rec.Pool]
		in, ok := running[rec.ContainerID]
		s.mu.Lock()
		keep := p != nil && ok && in.Phase == PhaseRunning && p.image == rec.Image && p.warming < p.spec.Size
		if keep {
			p.warming++
			rec.Address, rec.Address6, rec.Pid = in.Address, in.Address6, in.Pid
			if in.Node != "" {
				rec.Node = in.Node
			}
			s.hub.Put(s.watchView(rec))
		}
		s.mu.Unlock()
		if !keep {
			s.log.Info("dropping a warm pool member found at start", "pool", rec.Pool, "sandbox_id", rec.ID)
			s.dropMember(rec)
			continue
		}
		s.wg.Go(func() {
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReadyTimeout)
			defer cancel()
			err := s.awaitMember(ctx, rec)
			s.mu.Lock()
			p.warming--
			if err == nil {
				p.ready = append(p.ready, rec)
			}
			s.mu.Unlock()
			if err != nil {
				s.dropMember(rec)
			}
			p.wake()
		})
	}
}

// PoolStatus is one warm pool's state, for metrics and `airlock doctor`-style views.
type PoolStatus struct {
	Name    string `json:"name"`
	Image   string `json:"image"`
	Size    int    `json:"size"`
	Ready   int    `json:"ready"`
	Warming int    `json:"warming"`
}

// Pools reports the warm pools.
func (s *Server) Pools() []PoolStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PoolStatus, 0, len(s.pools))
	for _, p := range s.pools {
		out = append(out, PoolStatus{Name: p.spec.Name, Image: p.spec.Image, Size: p.spec.Size, Ready: len(p.ready), Warming: p.warming})
	}
	return out
}

// awaitReady waits until addr accepts a TCP connection or, with path, answers a GET of
// path with 2xx, at most timeout.
func awaitReady(ctx context.Context, addr, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Timeout: time.Second}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	for {
		var err error
		if path == "" {
			var c net.Conn
			if c, err = d.DialContext(ctx, "tcp", addr); err == nil {
				c.Close()
				return nil
			}
		} else {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
			var resp *http.Response
			if resp, err = client.Do(req); err == nil {
				io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					return nil
				}
				err = fmt.Errorf("GET %s answered %s", path, resp.Status)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the entrypoint was not ready on %s within %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// releaseEnv is the env execd is released with: DefaultEnv, then env over it (never
// nil).
func (s *Server) releaseEnv(env map[string]string) map[string]string {
	out := maps.Clone(s.cfg.DefaultEnv)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, env)
	return out
}
