package lifecycle

import (
	"context"
	"encoding/json"
	"time"

	"github.com/airlockdev/airlock/policies"
)

// egressSummary reduces an effective policy document to what a coarse second layer
// can enforce (Egress): a policy in audit mode or with an allow default allows all;
// an allow of "*" allows all (a deny rule in audit mode counts as an allow); an allow of a name or wildcard allows by name; an allow
// of an address or CIDR adds that prefix. A document that does not parse allows
// nothing (fail closed).
func egressSummary(id string, doc json.RawMessage) Egress {
	if len(doc) == 0 || string(doc) == "null" {
		return Egress{AllowAll: true} // no policy: egress is not restricted
	}
	p, err := policies.Parse(id, doc)
	if err != nil {
		return Egress{}
	}
	if p.EffectiveMode() == policies.AuditMode || p.DefaultAction == policies.Allow {
		return Egress{AllowAll: true}
	}
	var eg Egress
	for i := range p.Egress {
		r := &p.Egress[i]
		if r.Action != policies.Allow && p.RuleMode(r) != policies.AuditMode {
			continue // a deny in audit mode lets its targets through, as an allow does
		}
		t, err := policies.ParseTarget(r.Target)
		if err != nil {
			continue
		}
		switch t.Kind {
		case policies.KindAll:
			return Egress{AllowAll: true}
		case policies.KindPrefix:
			eg.CIDRs = append(eg.CIDRs, t.Prefix)
		default:
			eg.ByName = true
		}
	}
	return eg
}

// egressOfLocked is rec's egress summary; s.mu is held.
func (s *Server) egressOfLocked(rec *record) Egress {
	doc, _ := s.lib.effective(rec)
	return egressSummary(rec.ID, doc)
}

// updateEgress hands the runtime's second layer (EgressUpdater) the sandbox's new
// egress summary after a policy change; a failure is logged (egressd stays the
// enforcement of record).
func (s *Server) updateEgress(ctx context.Context, id string) {
	s.mu.Lock()
	e, found := s.sbx[id]
	s.mu.Unlock()
	if found {
		s.updateEgressOf(ctx, e.rec)
	}
}

// updateEgressOf is updateEgress for a record at hand (a warm pool member being
// claimed, not yet in the registry).
func (s *Server) updateEgressOf(ctx context.Context, rec *record) {
	s.mu.Lock()
	update := s.egressUpdateLocked(rec)
	s.mu.Unlock()
	update(ctx)
}

// egressUpdateLocked returns what updateEgressOf does once s.mu is released: the
// runtime's second layer brought to rec's policy as it is now (a no-op without an
// EgressUpdater runtime). s.mu is held.
func (s *Server) egressUpdateLocked(rec *record) func(context.Context) {
	up, ok := s.rt.(EgressUpdater)
	if !ok {
		return func(context.Context) {}
	}
	inst := Instance{SandboxID: rec.ID, ContainerID: rec.ContainerID, Address: rec.Address, Node: rec.Node}
	eg := s.egressOfLocked(rec)
	return func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := up.UpdateEgress(ctx, inst, eg); err != nil {
			s.log.Error("updating the sandbox's second network layer failed", "sandbox_id", inst.SandboxID, "err", err)
		}
	}
}
