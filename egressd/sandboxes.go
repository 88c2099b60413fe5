package egressd

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/internal/cgroupv2"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

// sandbox is what egressd holds for one sandbox of this node.
type sandbox struct {
	view     watch.Sandbox
	addrs    []netip.Addr
	c        compiled
	attached bool
	// veth is the host-side interface the datapath was attached to ("" until then; kept
	// across policy updates).
	veth string
	// learned maps each learned address to the names it was learned through and
	// when it expires, so a policy change can forget what the new policy denies.
	learned map[netip.Addr]learnedAddr
}

type learnedAddr struct {
	names []string
	until time.Time
	// every and grants are what the datapath was told: every port, or these grants.
	every  bool
	grants []datapath.ProtoPorts
}

// addGrants records grants (nil: every port) as learned.
func (l *learnedAddr) addGrants(grants []datapath.ProtoPorts) {
	if grants == nil {
		l.every = true
	}
	for _, g := range grants {
		if !slices.Contains(l.grants, g) {
			l.grants = append(l.grants, g)
		}
	}
}

// maxLearnedTracked bounds the learned-address bookkeeping per sandbox; expired
// entries are pruned first.
const maxLearnedTracked = 4096

// handler adapts the Daemon to watch.Handler.
type handler struct{ d *Daemon }

func (h handler) Upsert(s watch.Sandbox, _ uint64) { h.d.upsert(s) }
func (h handler) Delete(id string, _ uint64) {
	h.d.remove(id, "deleted")
	h.d.deleted(id)
}

// deleted tells Config.OnDelete that sandbox id left the watch.
func (d *Daemon) deleted(id string) {
	if d.cfg.OnDelete != nil {
		d.cfg.OnDelete(id)
	}
}

// Replace applies a snapshot: every listed sandbox is applied; every sandbox egressd
// holds or the datapath has attached (adopted from a previous process) that is not
// listed is detached.
func (h handler) Replace(all []watch.Sandbox, _ uint64) {
	d := h.d
	keep := map[string]bool{}
	for _, s := range all {
		keep[s.ID] = true
		d.unqueue(s.ID)
		d.apply(s)
	}
	d.mu.RLock()
	var gone []string
	for id := range d.byID {
		if !keep[id] {
			gone = append(gone, id)
		}
	}
	d.mu.RUnlock()
	for _, id := range d.dp.Attached() {
		if !keep[id] {
			gone = append(gone, id)
		}
	}
	for _, id := range gone {
		d.remove(id, "not in the lifecycle snapshot")
		d.deleted(id)
	}
}

// enforceable reports whether s is a sandbox of this node whose traffic needs a filter:
// it has an address and a process or host interface to find its veth by (a pod: its
// address, whose route names the veth).
func (d *Daemon) enforceable(s watch.Sandbox) bool {
	if s.Node != "" && d.cfg.Node != "" && s.Node != d.cfg.Node {
		return false
	}
	switch s.State {
	case "Terminated", "Failed":
		return false
	}
	return s.Address.IsValid() && (s.Runtime.Pid > 0 || s.Runtime.HostInterface != "" || s.Runtime.Kind == RuntimeKubernetes)
}

// apply brings the datapath and the DNS directory in line with s: attach a new
// sandbox, update a changed policy, detach one that stopped.
func (d *Daemon) apply(s watch.Sandbox) {
	if !d.enforceable(s) {
		d.remove(s.ID, "state "+s.State)
		return
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.RLock()
	old := d.byID[s.ID]
	d.mu.RUnlock()
	addrs := []netip.Addr{s.Address}
	if s.Address6.IsValid() {
		addrs = append(addrs, s.Address6)
	}
	samePolicy := old != nil && old.view.PolicyVersion == s.PolicyVersion && bytes.Equal(old.view.Policy, s.Policy)
	if old != nil && old.attached && samePolicy && slices.Equal(old.addrs, addrs) {
		d.mu.Lock()
		old.view = s // state or expiry changed: nothing to enforce differently
		d.mu.Unlock()
		return
	}
	c := compiled{}
	if old != nil && samePolicy {
		c = old.c
	} else {
		c = d.compile(s)
	}
	sb := &sandbox{view: s, addrs: addrs, c: c, learned: map[netip.Addr]learnedAddr{}}
	if old != nil {
		sb.learned, sb.veth = old.learned, old.veth
	}
	switch {
	case old != nil && old.attached && slices.Equal(old.addrs, addrs):
		if err := d.dp.Update(s.ID, c.policy); err != nil {
			d.log.Error("policy update failed; the previous policy stays in force", "sandbox_id", s.ID, "err", err)
			d.metrics.errors.WithLabelValues("update").Inc()
			return
		}
		sb.attached = true
		d.forgetDenied(sb)
		d.metrics.updates.Inc()
		d.log.Info("policy updated", "sandbox_id", s.ID, "policy_version", s.PolicyVersion)
	default:
		span := attachSpan(s)
		ifindex, ifname, err := sandboxVeth(s.Runtime, s.Address)
		if err == nil {
			err = d.dp.Attach(datapath.Spec{
				ID: s.ID, HostIfindex: ifindex, HostIfname: ifname, Addrs: addrs,
				Resolvers: []netip.Addr{d.resolver}, Policy: c.policy, Cgroup: d.sandboxCgroup(s.Runtime),
			})
		}
		endAttachSpan(span, err, string(d.dp.Backend()))
		if err != nil {
			if old == nil || old.attached {
				d.log.Error("attach failed; retrying", "sandbox_id", s.ID, "err", err)
			}
			d.metrics.errors.WithLabelValues("attach").Inc()
		} else {
			sb.attached, sb.veth = true, ifname
			d.forgetDenied(sb)
			d.log.Info("sandbox attached", "sandbox_id", s.ID, "veth", ifname, "backend", d.dp.Backend(),
				"policy_version", s.PolicyVersion)
		}
	}
	d.mu.Lock()
	if old != nil {
		for _, a := range old.addrs {
			if d.byAddr[a] == old {
				delete(d.byAddr, a)
			}
		}
	}
	d.byID[s.ID] = sb
	if sb.attached {
		// Only an enforced sandbox gets answers: learning for an unattached one would
		// have nowhere to go.
		for _, a := range addrs {
			d.byAddr[a] = sb
		}
	}
	d.metrics.sandboxes.Set(float64(len(d.byID)))
	d.mu.Unlock()
}

// sandboxCgroup is the cgroup v2 directory of the sandbox, where the datapath's socket
// layer attaches: its process's, or for a pod (Runtime.Kind RuntimeKubernetes) the
// pod's cgroup, found by Runtime.PodUID under Config.CgroupRoot in kubelet's layout
// (cgroupv2.OfPod), above every container of the pod. "" when it cannot be found or
// is the hierarchy's root (a runtime that joins only v1 hierarchies: attaching there
// would filter every process of the host by this sandbox's policy). The veth filter
// enforces alone then, and a denied connection is dropped, not refused.
func (d *Daemon) sandboxCgroup(rt watch.Runtime) string {
	var dir string
	var err error
	switch {
	case rt.Pid > 0:
		dir, err = cgroupv2.OfPid(rt.Pid)
	case rt.Kind == RuntimeKubernetes && rt.PodUID != "":
		dir, err = cgroupv2.OfPod(d.cfg.CgroupRoot, rt.PodUID)
		if err != nil {
			d.log.Warn("pod cgroup not found; denied connections are dropped, not refused", "pod_uid", rt.PodUID, "err", err)
		}
	default:
		return ""
	}
	if err != nil || cgroupv2.IsRoot(dir) {
		return ""
	}
	return dir
}

// compile compiles s's policy document under the overlay; a sandbox without one gets
// the default policy, a sandbox whose document does not compile gets deny-all (fail
// closed; lifecycle validates documents, so this means a version skew).
func (d *Daemon) compile(s watch.Sandbox) compiled {
	opts := policies.CompileOptions{Overlay: d.cfg.Overlay, Version: s.PolicyVersion}
	doc := []byte(s.Policy)
	if len(bytes.TrimSpace(doc)) == 0 || string(bytes.TrimSpace(doc)) == "null" {
		doc = d.fallback
	}
	// The source names the document in rule reasons; the record already names the
	// sandbox, and sandboxes under one named policy share the compiled result.
	p, err := policies.Parse("policy", doc)
	var dec *policies.Decider
	if err == nil {
		if d.l7 != nil && p.EffectiveL7() == policies.L7SNI {
			l7Scope(p) // what the L7 proxy cannot check is not granted by default
		}
		dec, err = policies.Compile(p, opts)
	}
	if err != nil {
		d.log.Error("sandbox policy does not compile; denying all egress", "sandbox_id", s.ID, "err", err)
		d.metrics.errors.WithLabelValues("policy").Inc()
		dec, _ = policies.Load(s.ID, []byte(`{"defaultAction":"deny","egress":[]}`), opts)
	}
	o := compileOptions{l7: d.l7 != nil, credential: s.CredentialProxy && d.cred != nil}
	if d.cfg.ProxyPort != 0 {
		o.proxy = netip.AddrPortFrom(d.resolver, d.cfg.ProxyPort)
	}
	return compile(dec, o)
}

// forgetDenied drops learned addresses none of whose names the sandbox's (new) policy
// still allows, cutting their established flows (datapath.Forget).
func (d *Daemon) forgetDenied(sb *sandbox) {
	d.mu.Lock() // sb.learned is shared with the entry the DNS path still sees
	defer d.mu.Unlock()
	now := time.Now()
	for a, l := range sb.learned {
		if now.After(l.until) {
			delete(sb.learned, a)
			continue
		}
		// What the names still allowed may reach at this address now.
		var still learnedAddr
		allowed := false
		for _, n := range l.names {
			dec := sb.c.decider.DecideName(n, 0, "")
			if dec.Allowed() && !dec.Ports.Empty() && sb.c.decider.DecideLearned(n, a, 0, "").Allowed() {
				allowed = true
				still.addGrants(learnedGrants(dec.Ports))
			}
		}
		narrowed := l.every && !still.every
		if !still.every {
			for _, g := range l.grants {
				narrowed = narrowed || !slices.Contains(still.grants, g)
			}
		}
		switch {
		case !allowed:
			if err := d.dp.Forget(sb.view.ID, a); err != nil && !errors.Is(err, datapath.ErrUnknownSandbox) {
				d.log.Warn("forget failed", "sandbox_id", sb.view.ID, "addr", a, "err", err)
			}
			delete(sb.learned, a)
		case narrowed:
			// The names keep what the new policy still grants, for the rest of the TTL;
			// only flows on ports no longer granted are cut.
			grants := still.grants
			if still.every {
				grants = nil
			}
			if err := d.dp.Narrow(sb.view.ID, a, grants, l.until.Sub(now)); err != nil {
				d.log.Warn("narrow failed", "sandbox_id", sb.view.ID, "addr", a, "err", err)
				if !errors.Is(err, datapath.ErrUnknownSandbox) {
					_ = d.dp.Forget(sb.view.ID, a) // fail closed
				}
				delete(sb.learned, a)
				continue
			}
			l.every, l.grants = still.every, still.grants
			sb.learned[a] = l
		}
	}
}

// remove detaches id (every hook, map entry, rule and set of it) and drops it from the
// DNS directory. Unknown ids are ignored.
func (d *Daemon) remove(id, why string) {
	d.unqueue(id)
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	sb := d.byID[id]
	if sb != nil {
		for _, a := range sb.addrs {
			if d.byAddr[a] == sb {
				delete(d.byAddr, a)
			}
		}
		delete(d.byID, id)
	}
	d.metrics.sandboxes.Set(float64(len(d.byID)))
	d.mu.Unlock()
	err := d.dp.Detach(id)
	switch {
	case err == nil:
		d.log.Info("sandbox detached", "sandbox_id", id, "why", why)
	case errors.Is(err, datapath.ErrUnknownSandbox):
	default:
		d.log.Error("detach failed", "sandbox_id", id, "err", err)
		d.metrics.errors.WithLabelValues("detach").Inc()
	}
}

// Enforced reports whether the datapath enforces sandbox id's policy (attached and in
// the DNS directory). Lifecycle's ready gate uses it: a sandbox is reported Running
// only once its egress is enforced.
func (d *Daemon) Enforced(id string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	sb := d.byID[id]
	return sb != nil && sb.attached
}

// EnforcedVersion is the policy version the datapath enforces for id; ok is false
// when id is not attached.
func (d *Daemon) EnforcedVersion(id string) (version uint64, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	sb := d.byID[id]
	if sb == nil || !sb.attached {
		return 0, false
	}
	return sb.view.PolicyVersion, true
}

// lookup is the DNS filter's directory: source address → sandbox. No I/O.
func (d *Daemon) lookup(src netip.Addr) (dnsfilter.Sandbox, bool) {
	d.mu.RLock()
	sb := d.byAddr[src.Unmap()]
	d.mu.RUnlock()
	if sb == nil {
		return dnsfilter.Sandbox{}, false
	}
	return dnsfilter.Sandbox{ID: sb.view.ID, Policy: sb.c.decider}, true
}

// learnedGrants maps the ports a name may reach to datapath grants: nil (every port)
// when the name's rules have no ports.
func learnedGrants(ps policies.PortSet) []datapath.ProtoPorts {
	if ps.All() {
		return nil
	}
	var out []datapath.ProtoPorts
	for _, pp := range []struct {
		proto  datapath.Proto
		ranges []policies.PortRange
	}{{datapath.ProtoTCP, ps.TCP}, {datapath.ProtoUDP, ps.UDP}} {
		for _, r := range pp.ranges {
			out = append(out, datapath.ProtoPorts{Proto: pp.proto, Ports: datapath.PortRange{First: r.First, Last: r.Last}})
		}
	}
	return out
}

// learn is the DNS filter's learning hook: the answer's addresses are programmed into
// the datapath before the answer is written.
func (d *Daemon) learn(_ context.Context, l dnsfilter.Learned) error {
	if l.Ports.Empty() {
		return nil // the name reaches no TCP or UDP port: nothing to learn
	}
	grants := learnedGrants(l.Ports)
	for _, a := range l.Addrs {
		if err := d.dp.Learn(l.SandboxID, a, grants, l.TTL); err != nil {
			d.metrics.learns.WithLabelValues("error").Inc()
			return err
		}
	}
	d.metrics.learns.WithLabelValues("ok").Add(float64(len(l.Addrs)))
	until := time.Now().Add(l.TTL)
	d.mu.Lock()
	defer d.mu.Unlock()
	sb := d.byID[l.SandboxID]
	if sb == nil {
		return nil
	}
	if len(sb.learned) >= maxLearnedTracked {
		now := time.Now()
		for a, e := range sb.learned {
			if now.After(e.until) {
				delete(sb.learned, a)
			}
		}
	}
	for _, a := range l.Addrs {
		e := sb.learned[a]
		if !slices.Contains(e.names, l.Name) && len(e.names) < 8 {
			e.names = append(e.names, l.Name)
		}
		if until.After(e.until) {
			e.until = until
		}
		e.addGrants(grants)
		if len(sb.learned) < maxLearnedTracked || len(e.names) > 1 {
			sb.learned[a] = e
		}
	}
	return nil
}

// auditEvents turns datapath events into audit records, one per flow (flowAudit),
// until the datapath closes its event channel; then it writes what is still open.
func (d *Daemon) auditEvents() {
	backend := string(d.dp.Backend())
	counter, _ := d.dp.(datapath.FlowCounter)
	window := datapath.DefaultFlowWindow
	if counter != nil {
		window = counter.FlowWindow()
	}
	var flows *flowAudit
	if d.cfg.Audit != nil {
		flows = newFlowAudit(window, counter, rate.Limit(d.cfg.FlowAuditRate), d.cfg.FlowAuditBurst, d.cfg.Audit.Append)
		flows.onSuppress = func(n int) { d.metrics.suppressed.Add(float64(n)) }
	}
	tick := time.NewTicker(window / 4)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			if flows != nil {
				flows.tick(now)
			}
			continue
		case ev, ok := <-d.dp.Events():
			if !ok {
				if flows != nil {
					flows.close()
				}
				return
			}
			d.metrics.events.WithLabelValues(ev.Kind.String()).Inc()
			if flows == nil {
				continue
			}
			if rec, ok := d.eventRecord(ev, backend); ok {
				flows.add(ev, rec)
			}
		}
	}
}

// eventRecord is the audit record of one datapath event on its own; ok is false for
// allowed flows of sandboxes that audit denials only.
func (d *Daemon) eventRecord(ev datapath.Event, backend string) (audit.Record, bool) {
	rec := audit.Record{
		Time: ev.Time, SandboxID: ev.Sandbox, Source: audit.SourceBPF, Proto: ev.Proto.String(),
		Src: ev.Src.String(), DstIP: ev.Dst.Addr().String(), DstPort: int(ev.Dst.Port()),
		Reason: ev.Reason.String(), Extra: map[string]any{"backend": backend},
	}
	if ev.Refused {
		rec.Src = ev.Src.Addr().String()
	}
	switch ev.Kind {
	case datapath.KindFlow:
		rec.Action = string(policies.Allow)
	case datapath.KindWouldDrop:
		rec.Action, rec.WouldDeny = string(policies.Allow), true
	default:
		rec.Action = string(policies.Deny)
	}
	d.mu.RLock()
	var initPID int
	if sb := d.byID[ev.Sandbox]; sb != nil {
		if ev.Kind == datapath.KindFlow && sb.c.decider.AuditLevel() == policies.AuditDenied {
			d.mu.RUnlock()
			return audit.Record{}, false
		}
		rec.Mode, rec.PolicyVersion = string(sb.c.decider.Mode()), sb.view.PolicyVersion
		rec.Rule = sb.c.rule(ev.Rule)
		if l, ok := sb.learned[ev.Dst.Addr()]; ok && len(l.names) > 0 {
			rec.DstHost = l.names[0]
		}
		initPID = sb.view.Runtime.Pid
	}
	d.mu.RUnlock()
	// /proc is read outside the lock.
	if ev.Process != nil {
		rec.Extra["process"], rec.Extra["execution"] = processExtra(ev.Process, initPID)
	}
	return rec, true
}
