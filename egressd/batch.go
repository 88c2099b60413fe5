package egressd

import (
	"bytes"
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// Policy changes of attached sandboxes are applied in batches when the datapath can
// (datapath.BatchUpdater: one kernel grace period for all, where one by one each waits
// its own). An edit of a named policy republishes every sandbox that uses it, so a
// burst of such changes arrives from the watch at once: they are queued, and the
// batcher applies what accumulated once the burst has paused for batchQuiet (at most
// batchLinger after the first). Anything else (attach, address change, detach) is
// applied at once and supersedes a queued change of the same sandbox.
const (
	batchQuiet  = 3 * time.Millisecond
	batchLinger = 20 * time.Millisecond
)

// batcher holds the queued policy changes.
type batcher struct {
	mu     sync.Mutex
	queued map[string]watch.Sandbox
	kick   chan struct{}
}

func newBatcher() *batcher {
	return &batcher{queued: map[string]watch.Sandbox{}, kick: make(chan struct{}, 1)}
}

// upsert applies s, queueing it when it only changes the policy of an attached sandbox
// and the datapath updates in batches.
func (d *Daemon) upsert(s watch.Sandbox) {
	if _, ok := d.dp.(datapath.BatchUpdater); ok && d.batch != nil && d.policyOnly(s) {
		d.batch.mu.Lock()
		d.batch.queued[s.ID] = s
		d.batch.mu.Unlock()
		select {
		case d.batch.kick <- struct{}{}:
		default:
		}
		return
	}
	d.unqueue(s.ID)
	d.apply(s)
}

// unqueue drops a queued change of id (a newer view is being applied, or it goes).
func (d *Daemon) unqueue(id string) {
	if d.batch == nil {
		return
	}
	d.batch.mu.Lock()
	delete(d.batch.queued, id)
	d.batch.mu.Unlock()
}

// policyOnly reports whether s differs from the enforced view of an attached sandbox in
// its policy alone.
func (d *Daemon) policyOnly(s watch.Sandbox) bool {
	if !d.enforceable(s) {
		return false
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	old := d.byID[s.ID]
	if old == nil || !old.attached || !slices.Equal(old.addrs, viewAddrs(s)) {
		return false
	}
	return old.view.PolicyVersion != s.PolicyVersion || !bytes.Equal(old.view.Policy, s.Policy)
}

func viewAddrs(s watch.Sandbox) []netip.Addr {
	addrs := []netip.Addr{s.Address}
	if s.Address6.IsValid() {
		addrs = append(addrs, s.Address6)
	}
	return addrs
}

// runBatcher applies queued policy changes until ctx ends.
func (d *Daemon) runBatcher(ctx context.Context) {
	if d.batch == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.batch.kick:
		}
		// Let the burst finish: wait while changes keep coming, up to batchLinger.
		deadline := time.Now().Add(batchLinger)
		n := -1
		for time.Now().Before(deadline) {
			d.batch.mu.Lock()
			cur := len(d.batch.queued)
			d.batch.mu.Unlock()
			if cur == n {
				break
			}
			n = cur
			time.Sleep(batchQuiet)
		}
		d.batch.mu.Lock()
		views := make([]watch.Sandbox, 0, len(d.batch.queued))
		for _, s := range d.batch.queued {
			views = append(views, s)
		}
		clear(d.batch.queued)
		d.batch.mu.Unlock()
		if len(views) > 0 {
			d.applyBatch(views)
		}
	}
}

// applyBatch updates the policies of views (attached sandboxes) with one UpdateMany.
// A view older than what is enforced by now (a later one was applied at once) is
// skipped; one that is no longer a policy-only change is applied alone.
func (d *Daemon) applyBatch(views []watch.Sandbox) {
	bu := d.dp.(datapath.BatchUpdater)
	d.applyMu.Lock()
	type pending struct {
		old *sandbox
		sb  *sandbox
	}
	var ps []pending
	var ups []datapath.PolicyUpdate
	var alone []watch.Sandbox
	d.mu.RLock()
	for _, s := range views {
		old := d.byID[s.ID]
		switch {
		case old == nil || !old.attached || !slices.Equal(old.addrs, viewAddrs(s)):
			alone = append(alone, s)
			continue
		case s.PolicyVersion < old.view.PolicyVersion,
			s.PolicyVersion == old.view.PolicyVersion && bytes.Equal(old.view.Policy, s.Policy):
			continue
		}
		ps = append(ps, pending{old: old, sb: &sandbox{view: s, addrs: old.addrs, learned: old.learned}})
	}
	d.mu.RUnlock()
	// Sandboxes under one named policy share document and version: compile each once.
	type ckey struct {
		doc     string
		version uint64
		cred    bool
	}
	cache := map[ckey]compiled{}
	for _, p := range ps {
		v := p.sb.view
		k := ckey{string(v.Policy), v.PolicyVersion, v.CredentialProxy}
		c, ok := cache[k]
		if !ok {
			c = d.compile(v)
			cache[k] = c
		}
		p.sb.c = c
		ups = append(ups, datapath.PolicyUpdate{ID: v.ID, Policy: c.policy})
	}
	errs := bu.UpdateMany(ups)
	applied := 0
	for i, p := range ps {
		if errs[i] != nil {
			d.log.Error("policy update failed; the previous policy stays in force", "sandbox_id", p.sb.view.ID, "err", errs[i])
			d.metrics.errors.WithLabelValues("update").Inc()
			continue
		}
		p.sb.attached = true
		d.forgetDenied(p.sb)
		d.metrics.updates.Inc()
		d.mu.Lock()
		for _, a := range p.old.addrs {
			if d.byAddr[a] == p.old {
				delete(d.byAddr, a)
			}
		}
		d.byID[p.sb.view.ID] = p.sb
		for _, a := range p.sb.addrs {
			d.byAddr[a] = p.sb
		}
		d.mu.Unlock()
		applied++
	}
	d.applyMu.Unlock()
	if applied > 0 {
		d.log.Info("policies updated", "sandboxes", applied, "batch", true)
	}
	for _, s := range alone {
		d.apply(s)
	}
}
