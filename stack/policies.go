package stack

import (
	"context"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies/library"
)

// PoliciesConfig configures the library of named policies (package policies/library).
type PoliciesConfig struct {
	// Dir holds one policy file per named policy (python-packages.yaml is
	// "python-packages"); default /etc/airlock/policies, created when missing. Changes are
	// applied to every sandbox that uses the policy as soon as they are saved.
	Dir string `yaml:"dir"`
	// Default names the policy of sandboxes created with neither a networkPolicy nor
	// the extension airlock.dev/policy; empty: egressd's default (allow, minus the
	// operator overlay).
	Default string `yaml:"default"`
}

// startPolicies opens the policy library and watches its directory until Stop.
func (s *Stack) startPolicies(context.Context) error {
	lib, err := library.Open(library.Config{
		Dir:     s.cfg.Policies.Dir,
		Store:   s.Store,
		OnEvent: s.policyEvent,
		Log:     s.log.With("component", "policies"),
	})
	if err != nil {
		return err
	}
	s.Library = lib
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := lib.Run(ctx); err != nil {
			s.log.Error("policy library watch stopped; edits are applied at the next start", "err", err)
		}
	}()
	s.stopPoliciesFn = func() { cancel(); <-done }
	return nil
}

func (s *Stack) stopPolicies(context.Context) error {
	if s.stopPoliciesFn != nil {
		s.stopPoliciesFn()
	}
	return nil
}

// policyEvent audits what a library (re)load did and, for a new version, republishes
// the sandboxes that use the policy (egressd enforces it within milliseconds).
func (s *Stack) policyEvent(ev library.Event) {
	rec := audit.Record{
		Time: time.Now(), Source: audit.SourcePolicy, Action: "allow", PolicyVersion: ev.Policy.Version,
		Extra: map[string]any{"change": "library", "policy": ev.Name, "file": ev.File, "sha256": ev.Policy.SHA256},
	}
	switch {
	case ev.Applied:
		rec.Reason = "named policy applied: " + ev.Name
	case ev.Rejected:
		rec.Action, rec.Reason = "deny", "named policy rejected, the previous version stays in force: "+ev.Err.Error()
	case ev.Removed:
		rec.Reason = "named policy file removed: sandboxes that use it keep its last version"
	}
	if s.Audit != nil {
		s.Audit.Append(rec)
	}
	if ev.Applied {
		if lc := s.lifecycleSrv.Load(); lc != nil {
			n := lc.NamedPolicyChanged(ev.Name)
			s.log.Info("named policy republished", "policy", ev.Name, "version", ev.Policy.Version, "sandboxes", n)
		}
	}
}
