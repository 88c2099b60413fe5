package conformance_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// fakeEgressd is a node's egressd status route that the test controls: which policy
// version it enforces per sandbox (none: 404).
type fakeEgressd struct {
	mu       sync.Mutex
	enforced map[string]uint64
	asked    map[string]int
}

func (f *fakeEgressd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutPrefix(r.URL.Path, watch.EnforcedPath)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[id]++
	v, on := f.enforced[id]
	if !ok || !on {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	_ = json.NewEncoder(w).Encode(watch.Enforced{SandboxID: id, PolicyVersion: v})
}

func (f *fakeEgressd) set(id string, v uint64) {
	f.mu.Lock()
	f.enforced[id] = v
	f.mu.Unlock()
}

// On Kubernetes a sandbox's entrypoint is released, and a policy change answered, only
// once the egressd of the pod's node reports it enforced (watch.EnforcedPath at the
// pod's hostIP).
func TestEnforcementGate(t *testing.T) {
	env, sandboxNS, systemNS := kubeWorld(t)
	fe := &fakeEgressd{enforced: map[string]uint64{}, asked: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the test kubelet's pods have hostIP 127.0.0.1
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: fe}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	cp, err := cluster.Start(t.Context(), cluster.Config{
		Kube: env.Config, Listen: "127.0.0.1:0", Namespace: sandboxNS, SystemNamespace: systemNS,
		APIKey: apiKey, Identity: "gate", LeaseDuration: 2 * time.Second, ReadyTimeout: 60 * time.Second,
		EgressdPort: ln.Addr().(*net.TCPAddr).Port,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close() })
	c := &client{t: t, base: "http://" + cp.Addr.String()}
	id := c.create(sleeper(map[string]any{"networkPolicy": map[string]any{"defaultAction": "deny", "egress": []map[string]any{
		{"action": "allow", "target": "pypi.org"}}}}))
	t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
	// The pod runs and execd answers, but the node does not enforce the sandbox yet.
	deadline := time.Now().Add(30 * time.Second)
	for {
		fe.mu.Lock()
		n := fe.asked[id]
		fe.mu.Unlock()
		if n >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lifecycle never asked the node's egressd")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sb, _ := c.get(id); sb.Status.State != opensandbox.Pending {
		t.Fatalf("state %s before the node enforces the sandbox, want Pending", sb.Status.State)
	}
	fe.set(id, 1)
	c.waitState(id, opensandbox.Running)
	if out := c.run(id, "echo released"); out != "released" {
		t.Fatalf("after release: %q", out)
	}
	// A policy change answers once the node enforces the new version (2).
	setAt := make(chan time.Time, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		fe.set(id, 2)
		setAt <- time.Now()
	}()
	st, b := c.do("PATCH", "/v1/sandboxes/"+id+"/policy", []map[string]any{{"action": "allow", "target": "10.9.0.0/16"}})
	answered := time.Now()
	var pol lifecycle.PolicyResponse
	if st != http.StatusOK || json.Unmarshal(b, &pol) != nil {
		t.Fatalf("policy patch: %d %s", st, b)
	}
	if at := <-setAt; answered.Before(at) {
		t.Fatalf("the policy change answered before the node enforced it")
	}
	if pol.Version != 2 {
		t.Fatalf("policy version %d after one change, want 2", pol.Version)
	}
}
