package conformance_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/opensandbox"
)

// Two lifecycle replicas on one cluster serve the same sandboxes; exactly one leads
// and reaps; when the leader goes, the other takes over within the Lease duration
// (2 s here), and no sandbox is lost or reaped twice.
func TestReplicas(t *testing.T) {
	env, sandboxNS, systemNS := kubeWorld(t)
	cps := map[string]*cluster.ControlPlane{
		"r1": kubeReplica(t, env, sandboxNS, systemNS, "r1"),
		"r2": kubeReplica(t, env, sandboxNS, systemNS, "r2"),
	}
	t.Cleanup(func() {
		for _, cp := range cps {
			if cp != nil {
				cp.Close()
			}
		}
	})
	cl := map[string]*client{}
	for name, cp := range cps {
		cl[name] = &client{t: t, base: "http://" + cp.Addr.String()}
	}
	leader := func() []string {
		var out []string
		for name, c := range cl {
			if cps[name] != nil && c.metric("airlock_lifecycle_leader") == 1 {
				out = append(out, name)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(leader()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("leaders: %v, want exactly one", leader())
		}
		time.Sleep(50 * time.Millisecond)
	}
	lead := leader()[0]
	other := "r1"
	if lead == "r1" {
		other = "r2"
	}

	// Created on the follower, visible and usable on the leader, and the other way.
	a := cl[other].create(sleeper(map[string]any{"metadata": map[string]string{"case": "replicas"}}))
	// Read after write across replicas: the leader answers for a sandbox the other
	// replica created a moment ago, before its watch may have delivered it.
	if _, st := cl[lead].get(a); st != http.StatusOK {
		t.Fatalf("GET the new sandbox on the other replica right after create: %d, want 200", st)
	}
	cl[lead].waitState(a, opensandbox.Running)
	if out := cl[lead].run(a, "echo via-leader"); out != "via-leader" {
		t.Fatalf("execd through the other replica: %q", out)
	}
	b := cl[lead].create(sleeper(nil))
	cl[other].waitState(b, opensandbox.Running)

	// Short-lived sandboxes: the leader reaps them once.
	var short []string
	for range 3 {
		short = append(short, cl[other].create(sleeper(map[string]any{"timeout": 2})))
	}
	for _, id := range short {
		cl[other].waitGone(id)
		cl[lead].waitGone(id)
	}
	if n := cl[lead].metric("airlock_lifecycle_expired_total") + cl[other].metric("airlock_lifecycle_expired_total"); n != 3 {
		t.Fatalf("%v sandboxes reaped for 3 expired", n)
	}
	if n := cl[other].metric("airlock_lifecycle_expired_total"); n != 0 {
		t.Fatalf("the follower reaped %v sandboxes", n)
	}

	// The leader goes; sandboxes that expire now are reaped by the new leader.
	late := cl[other].create(sleeper(map[string]any{"timeout": 4}))
	cl[other].waitState(late, opensandbox.Running)
	reapedBefore := cl[lead].metric("airlock_lifecycle_expired_total")
	if err := cps[lead].Close(); err != nil {
		t.Fatal(err)
	}
	cps[lead] = nil
	start := time.Now()
	for cl[other].metric("airlock_lifecycle_leader") != 1 {
		if time.Since(start) > 2*time.Second+500*time.Millisecond {
			t.Fatalf("no takeover within the Lease duration")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("takeover after %s", time.Since(start))
	cl[other].waitGone(late)
	if n := cl[other].metric("airlock_lifecycle_expired_total"); n != 1 {
		t.Fatalf("the new leader reaped %v sandboxes, want 1", n)
	}
	if reapedBefore != 3 {
		t.Fatalf("the old leader had reaped %v", reapedBefore)
	}
	// Nothing lost: the long-lived sandboxes are still there and answer.
	for _, id := range []string{a, b} {
		if _, st := cl[other].get(id); st != http.StatusOK {
			t.Fatalf("sandbox %s lost: %d", id, st)
		}
	}
	if out := cl[other].run(b, "echo still"); out != "still" {
		t.Fatalf("after takeover: %q", out)
	}
}
