package kubestore_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/lifecycle/kubestore"
	"github.com/airlockdev/airlock/policies/library"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	os.Exit(code)
}

func newStore(t *testing.T, env *kubetest.Env, ns, identity string) *kubestore.Store {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(kubestore.Config{Client: env.Client, Dynamic: dyn, Namespace: ns, Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

type applied struct {
	mu   sync.Mutex
	docs map[string][]byte
	dels int
}

func (a *applied) apply(id string, doc []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if doc == nil {
		delete(a.docs, id)
		a.dels++
		return
	}
	a.docs[id] = doc
}

func (a *applied) get(id string) (map[string]any, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.docs[id]
	if !ok {
		return nil, false
	}
	var m map[string]any
	_ = json.Unmarshal(d, &m)
	return m, true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two replicas share one namespace: what one writes, the other follows (token
// included, from the Secret); its own writes are not echoed back; deletes arrive.
func TestReplicasFollowEachOther(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "kubestore")
	a, b := newStore(t, env, ns, "a"), newStore(t, env, ns, "b")
	ia, err := a.InstanceID()
	if err != nil {
		t.Fatal(err)
	}
	ib, err := b.InstanceID()
	if err != nil || ia != ib || ia == "" {
		t.Fatalf("instance ids %q and %q (err %v): replicas must share one", ia, ib, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seenA, seenB := &applied{docs: map[string][]byte{}}, &applied{docs: map[string][]byte{}}
	if err := a.Follow(ctx, seenA.apply); err != nil {
		t.Fatal(err)
	}
	if err := b.Follow(ctx, seenB.apply); err != nil {
		t.Fatal(err)
	}
	doc := `{"id":"s1abc","image":"debian:12","entrypoint":["sleep","1"],"metadata":{"team":"x"},` +
		`"createdAt":"2026-11-25T10:00:00.123456789Z","expiresAt":"2026-11-25T11:00:00Z",` +
		`"status":{"state":"Pending","reason":"provisioning","lastTransitionAt":"2026-11-25T10:00:00Z"},` +
		`"history":[{"state":"Pending"}],"accessToken":"tok-secret-1","secureAccess":true,` +
		`"policy":{"egress":[{"action":"allow","target":"example.com"}]},"policyVersion":3,"policyName":"base",` +
		`"pinnedPolicy":{"version":2,"sha256":"9a1e","snapshotId":"snap-s0","policy":{"defaultAction":"deny","egress":[{"action":"allow","target":"a.test"}]}},` +
		`"renewOnAccess":60,"credentialProxy":true,"deleteVolumes":["v1"],"address":"10.0.0.7",` +
		`"address6":"fd00::7","pid":42,"hostInterface":"veth1","node":"node-a","containerID":"sbx-s1abc",` +
		`"resourceLimits":{"cpu":"1"},"extensions":{"k":"v"},"platform":{"os":"linux","arch":"amd64"},` +
		`"claiming":true,"proposal":{"decision":"approve","digest":"0f60f1","lastSeq":7,"principal":"admin","at":"2026-11-25T10:05:00Z","savedAs":"learned"}}`
	if err := a.PutSandbox("s1abc", []byte(doc)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica b to see s1abc", func() bool { _, ok := seenB.get("s1abc"); return ok })
	var want, got map[string]any
	_ = json.Unmarshal([]byte(doc), &want)
	got, _ = seenB.get("s1abc")
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(got)
	if string(wantJSON) != string(gotJSON) {
		t.Fatalf("replica b got\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	// The token is in a Secret, not in the Sandbox resource.
	dyn, _ := dynamic.NewForConfig(env.Config)
	obj, err := dyn.Resource(kubestore.SandboxGVR).Namespace(ns).Get(ctx, "s1abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(obj.Object)
	if json.Valid(raw) && contains(raw, "tok-secret-1") {
		t.Fatalf("the Sandbox resource holds the access token: %s", raw)
	}

	// b changes it; a follows; a never saw its own write echoed.
	time.Sleep(200 * time.Millisecond)
	if _, ok := seenA.get("s1abc"); ok {
		t.Fatal("replica a was handed its own write")
	}
	upd := []byte(`{"id":"s1abc","image":"debian:12","createdAt":"2026-11-25T10:00:00Z","status":{"state":"Running"},"accessToken":"tok-secret-1"}`)
	if err := b.PutSandbox("s1abc", upd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica a to see b's change", func() bool {
		m, ok := seenA.get("s1abc")
		return ok && m["status"].(map[string]any)["state"] == "Running"
	})
	// a writes on top without knowing b's version: last writer wins.
	if err := a.PutSandbox("s1abc", []byte(doc)); err != nil {
		t.Fatalf("write over another replica's version: %v", err)
	}
	if err := a.DeleteSandbox("s1abc"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica b to see the delete", func() bool { _, ok := seenB.get("s1abc"); return !ok })
	if _, err := env.Client.CoreV1().Secrets(ns).Get(ctx, "airlock-access-s1abc", metav1.GetOptions{}); err == nil {
		t.Fatal("the access token Secret outlived its sandbox")
	}

	// A field the CRD does not know is refused, not silently pruned.
	if err := a.PutSandbox("s2", []byte(`{"id":"s2","image":"x","createdAt":"2026-11-25T10:00:00Z","brandNew":1}`)); err == nil {
		t.Fatal("a document with an unknown field was accepted")
	}
	// Sandboxes lists what is stored.
	if err := a.PutSandbox("s3", []byte(`{"id":"s3","image":"x","createdAt":"2026-11-25T10:00:00Z","accessToken":"t3"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica b's cache to hold s3", func() bool {
		all, err := b.Sandboxes()
		return err == nil && all["s3"] != nil && contains(all["s3"], `"accessToken":"t3"`)
	})
}

func contains(b []byte, s string) bool { return len(s) > 0 && bytesIndex(b, s) >= 0 }

func bytesIndex(b []byte, s string) int {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

// Exactly one replica leads; when it stops, another takes over within the Lease
// duration.
func TestOneLeaderAndTakeover(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "lease")
	var leaders atomic.Int32
	var maxLeaders atomic.Int32
	run := func(st *kubestore.Store, ctx context.Context, led *atomic.Bool) {
		st.Lead(ctx, func(lctx context.Context) {
			n := leaders.Add(1)
			for {
				m := maxLeaders.Load()
				if n <= m || maxLeaders.CompareAndSwap(m, n) {
					break
				}
			}
			led.Store(true)
			<-lctx.Done()
			led.Store(false)
			leaders.Add(-1)
		})
	}
	a, b := newStore(t, env, ns, "a"), newStore(t, env, ns, "b")
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	var ledA, ledB atomic.Bool
	doneA := make(chan struct{})
	go func() { run(a, ctxA, &ledA); close(doneA) }()
	waitFor(t, "a to lead", ledA.Load)
	go run(b, ctxB, &ledB)
	time.Sleep(3 * time.Second) // more than the Lease duration: b must not take over
	if ledB.Load() {
		t.Fatal("b leads while a holds the Lease")
	}
	stopA()
	<-doneA
	start := time.Now()
	waitFor(t, "b to take over", ledB.Load)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("takeover took %s, more than the Lease duration", d)
	}
	if m := maxLeaders.Load(); m != 1 {
		t.Fatalf("%d replicas led at once", m)
	}
}

func TestPolicyVersions(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "policies")
	a, b := newStore(t, env, ns, "a"), newStore(t, env, ns, "b")
	for _, name := range []string{"base", "Has_Underscore"} {
		if err := a.PutLibraryVersion(name, library.Stored{Version: 1, SHA256: "aa", File: name + ".yaml", Source: []byte("egress: []\n")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.PutLibraryVersion("base", library.Stored{Version: 2, SHA256: "bb", File: "base.yaml", Source: []byte("egress: [x]\n")}); err != nil {
		t.Fatal(err)
	}
	got, err := b.LibraryVersions()
	if err != nil {
		t.Fatal(err)
	}
	if got["base"].Version != 2 || string(got["base"].Source) != "egress: [x]\n" || got["Has_Underscore"].Version != 1 || len(got) != 2 {
		t.Fatalf("versions seen by another replica: %+v", got)
	}
}

// A leader that dies (its Lease held, never renewed, never released) is replaced
// within the Lease duration, and not before it runs out.
func TestTakeoverFromACrashedLeader(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "crash")
	now := metav1.NewMicroTime(time.Now())
	holder, secs := "crashed-replica", int32(2)
	_, err := env.Client.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "airlock-lifecycle"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t, env, ns, "survivor")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	led := make(chan time.Duration, 1)
	go st.Lead(ctx, func(lctx context.Context) {
		led <- time.Since(start)
		<-lctx.Done()
	})
	select {
	case d := <-led:
		t.Logf("took over after %s", d)
		if d < 1500*time.Millisecond {
			t.Fatalf("took over after %s, while the crashed leader's Lease (2 s) still ran", d)
		}
		if d > 2*time.Second+time.Second {
			t.Fatalf("took over after %s, more than the Lease duration plus one retry", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover from a crashed leader")
	}
}

// FetchSandbox reads a sandbox another replica wrote straight from the API server, token
// included, before (or without) any Follow; a missing one is nil without error.
func TestFetchSandbox(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "kubestore")
	a, b := newStore(t, env, ns, "a"), newStore(t, env, ns, "b")
	doc := `{"id":"f1abc","image":"debian:12","entrypoint":["sleep","1"],"metadata":{},` +
		`"createdAt":"2026-11-25T10:00:00Z","status":{"state":"Pending"},"accessToken":"tok-f1"}`
	if err := a.PutSandbox("f1abc", []byte(doc)); err != nil {
		t.Fatal(err)
	}
	got, err := b.FetchSandbox(context.Background(), "f1abc")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil || m["id"] != "f1abc" || m["accessToken"] != "tok-f1" {
		t.Fatalf("FetchSandbox = %s (%v), want the document with its token", got, err)
	}
	if got, err := b.FetchSandbox(context.Background(), "nosuch"); got != nil || err != nil {
		t.Fatalf("FetchSandbox(missing) = %s, %v; want nil, nil", got, err)
	}
}

// The leading replica is the only endpoint of the leader Service's EndpointSlice; when
// it stops leading the slice stops naming it, and the next leader names itself.
func TestLeaderEndpoint(t *testing.T) {
	env := kubetest.Shared(t, kubetest.AirlockCRDs())
	ns := env.Namespace(t, "leader")
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(identity, addr string) *kubestore.Store {
		st, err := kubestore.New(kubestore.Config{Client: env.Client, Dynamic: dyn, Namespace: ns, Identity: identity,
			LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
			Leader: kubestore.LeaderEndpoint{Service: "lifecycle-leader", Address: netip.MustParseAddr(addr), Port: 8080, Pod: identity}})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	endpoints := func() []string {
		es, err := env.Client.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), "lifecycle-leader", metav1.GetOptions{})
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		var out []string
		for _, ep := range es.Endpoints {
			out = append(out, ep.Addresses...)
			if ep.TargetRef == nil || ep.TargetRef.Name == "" || es.Labels["kubernetes.io/service-name"] != "lifecycle-leader" ||
				*es.Ports[0].Port != 8080 {
				out = append(out, "malformed")
			}
		}
		return out
	}
	a, b := mk("a", "10.0.0.1"), mk("b", "10.0.0.2")
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneA := make(chan struct{})
	go func() { a.Lead(ctxA, func(c context.Context) { <-c.Done() }); close(doneA) }()
	waitFor(t, "the slice to name a", func() bool { return slices.Equal(endpoints(), []string{"10.0.0.1"}) })
	go b.Lead(ctxB, func(c context.Context) { <-c.Done() })
	time.Sleep(500 * time.Millisecond)
	if got := endpoints(); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("while a leads the slice names %v", got)
	}
	stopA()
	<-doneA
	waitFor(t, "the slice to name b", func() bool { return slices.Equal(endpoints(), []string{"10.0.0.2"}) })
}
