package egressd

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/sdk"
)

// TestEgressdPoolClaimEnforced: a warm pool member is enforced deny-all while it waits
// (its held execd cannot be used, and nothing routes to it); a create claiming it
// answers Running only once egressd enforces the request's policy, so the very first
// command already meets it: the allowed name works and a denied address is refused.
func TestEgressdPoolClaimEnforced(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	limits := map[string]string{"cpu": "500m", "memory": "256Mi"}
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			// A world per backend: members warmed under one backend are not handed to
			// another.
			w := newWorld(t, func(o *lctest.Options) {
				o.Pools = []lifecycle.PoolSpec{{Image: img, Size: 2, ResourceLimits: limits}}
			})
			d, _ := w.daemon(t, mode, pinRoot(t))
			deadline := time.Now().Add(2 * time.Minute)
			for {
				ps := w.h.Server.Pools()
				members := 0
				d.mu.RLock()
				for _, sb := range d.byID {
					if sb.view.Pool != "" && sb.attached {
						members++
					}
				}
				d.mu.RUnlock()
				if ps[0].Ready == 2 && members == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pool %+v, %d members enforced", ps, members)
				}
				time.Sleep(20 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			t0 := time.Now()
			sb, err := w.api.Create(ctx, sdk.CreateRequest{Image: img, Resources: limits, Timeout: 10 * time.Minute,
				NetworkPolicy: json.RawMessage(startPolicy)})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("pooled create with policy answered in %s", time.Since(t0))
			defer w.api.Kill(context.Background(), sb.ID)
			if sb.Status.State != "Running" {
				t.Fatalf("create answered %s, want Running (claimed)", sb.Status.State)
			}
			x, err := w.api.Execd(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := attempt(t, x, "tcp", deniedIP, 80), refusal(mode, "tcp"); got != want {
				t.Errorf("first command, denied address: %q, want %q", got, want)
			}
			if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
				t.Errorf("allowed name: %q", got)
			}
		})
	}
}
