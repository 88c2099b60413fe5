package lifecycle

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// recreator is a RecreatingPauser whose one workload runs at 127.0.0.1 while not
// paused (a test execd answers there); resumeErr makes Resume fail.
type recreator struct {
	mu        sync.Mutex
	paused    bool
	resumed   int
	resumeErr error
	starting  bool // the workload is made and not started yet (a resumed pod being scheduled)
}

func (*recreator) Kind() string { return "kubernetes" }
func (*recreator) Create(_ context.Context, sp Spec) (Instance, error) {
	return Instance{SandboxID: sp.SandboxID, ContainerID: "pod-" + sp.SandboxID, Phase: PhaseCreated}, nil
}
func (*recreator) Remove(context.Context, Instance) error { return nil }
func (r *recreator) Pause(context.Context, string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = true
	return nil
}
func (r *recreator) Resume(context.Context, string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resumeErr != nil {
		return r.resumeErr
	}
	r.paused = false
	return nil
}
func (r *recreator) Resumed(context.Context, Instance) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resumed++
	return nil
}
func (r *recreator) Inspect(_ context.Context, cid string) (Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := Instance{SandboxID: cid[len("pod-"):], ContainerID: cid, Phase: PhaseRunning, Address: netip.MustParseAddr("127.0.0.1")}
	if r.paused {
		in.Phase, in.Address = PhasePaused, netip.Addr{}
	}
	if r.starting {
		in.Phase, in.Address = PhaseCreated, netip.Addr{}
	}
	return in, nil
}

var recreated string // the sandbox id of TestPauseRecreating's List

// List leaves a paused sandbox out, as the Kubernetes runtime does (no pod).
func (r *recreator) List(ctx context.Context) ([]Instance, error) {
	in, _ := r.Inspect(ctx, "pod-"+recreated)
	if in.Phase == PhasePaused {
		return nil, nil
	}
	return []Instance{in}, nil
}

// TestPauseRecreating: on a RecreatingPauser runtime, pause leaves the sandbox Paused
// without an address, and a resync keeps it Paused (its workload gone, the runtime
// reports it paused); resume takes it through the readiness (execd released again)
// to Running and tells the runtime (Resumed); a resume the runtime fails leaves it
// Failed, resume_failed, with the runtime's message.
func TestPauseRecreating(t *testing.T) {
	var mu sync.Mutex
	releases := 0
	execd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == opensandbox.ReleasePath {
			mu.Lock()
			releases++
			mu.Unlock()
		}
	}))
	defer execd.Close()
	_, portStr, _ := net.SplitHostPort(execd.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	rt := &recreator{}
	s, err := New(Config{Runtime: rt, Store: memStore{}, ExecdPort: port, ReadyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	timeout := int64(600)
	sb, err := s.Create(ctx, &CreateRequest{Image: &ImageSpec{URI: "img"}, Entrypoint: []string{"tail"}, Timeout: &timeout,
		ResourceLimits: map[string]string{"cpu": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	recreated = sb.ID
	state := func() Status {
		got, err := s.Get(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	for i := 0; state().State != opensandbox.Running; i++ {
		if i > 100 {
			t.Fatalf("not Running after create: %+v", state())
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := s.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	var addr netip.Addr
	s.peek(sb.ID, func(rec *record) { addr = rec.Address })
	if st := state(); st.State != opensandbox.Paused || addr.IsValid() {
		t.Fatalf("after pause: %+v, address %s; want Paused without an address", st, addr)
	}
	s.resync()
	if st := state(); st.State != opensandbox.Paused {
		t.Fatalf("after a resync: %+v; want Paused", st)
	}

	if err := s.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	s.peek(sb.ID, func(rec *record) { addr = rec.Address })
	mu.Lock()
	rel := releases
	mu.Unlock()
	if st := state(); st.State != opensandbox.Running || st.Reason != "resumed" || !addr.IsValid() || rel != 2 || rt.resumed != 1 {
		t.Fatalf("after resume: %+v, address %s, %d releases, %d Resumed; want Running (resumed), an address, 2, 1", st, addr, rel, rt.resumed)
	}

	if err := s.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	rt.resumeErr = errors.New("the pause image is gone")
	if err := s.Resume(ctx, sb.ID); err == nil {
		t.Fatal("a failed resume: no error")
	}
	if st := state(); st.State != opensandbox.Failed || st.Reason != "resume_failed" || st.Message != "the pause image is gone" {
		t.Fatalf("after a failed resume: %+v; want Failed, resume_failed, the runtime's message", st)
	}
}

// replicasMem is a SharedStore in memory that keeps the sandbox documents, for
// replicas that never write: Follow and Lead do nothing.
type replicasMem struct {
	memStore
	mu   sync.Mutex
	docs map[string][]byte
}

func (m *replicasMem) PutSandbox(id string, doc []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.docs[id] = doc
	return nil
}

func (m *replicasMem) DeleteSandbox(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.docs, id)
	return nil
}

func (m *replicasMem) Sandboxes() (map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.docs), nil
}

func (*replicasMem) Follow(context.Context, func(string, []byte)) error { return nil }
func (*replicasMem) Lead(context.Context, func(context.Context))        {}

// TestResyncLeavesAnotherReplicasResume: with replicas (a SharedStore), a sandbox
// Resuming in the record without this replica's operation lock (another replica
// resumes it) whose new workload is made and not started yet is left Resuming by this
// replica's resync and by a reconcile (a replica taking the lead), not taken for an
// exited container (Failed), which made the other replica's resume answer 500; once
// Resuming has lasted longer than any resume can, resync decides again. A single
// server (its own operations are under its lock) decides at once, as before.
func TestResyncLeavesAnotherReplicasResume(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "replicas", false: "single"}[shared], func(t *testing.T) {
			rt := &recreator{}
			var store StateStore = memStore{}
			if shared {
				store = &replicasMem{docs: map[string][]byte{}}
			}
			s, err := New(Config{Runtime: rt, Store: store, ExecdPort: 1, ReadyTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			timeout := int64(600)
			sb, err := s.Create(context.Background(), &CreateRequest{Image: &ImageSpec{URI: "img"}, Entrypoint: []string{"tail"},
				Timeout: &timeout, ResourceLimits: map[string]string{"cpu": "1"}})
			if err != nil {
				t.Fatal(err)
			}
			recreated = sb.ID
			rt.mu.Lock()
			rt.starting = true
			rt.mu.Unlock()
			s.mu.Lock()
			e := s.sbx[sb.ID]
			s.mu.Unlock()
			// What following another replica's resume leaves here: the record Resuming,
			// this replica's operation lock free.
			s.setStatus(e.rec, opensandbox.Resuming, "resuming", "")
			s.resync()
			got, _ := s.Get(sb.ID)
			if !shared {
				if got.Status.State != opensandbox.Failed {
					t.Fatalf("a single server's resync of a Resuming sandbox whose workload is not running: %+v; want Failed", got.Status)
				}
				return
			}
			if got.Status.State != opensandbox.Resuming {
				t.Fatalf("after a resync during another replica's resume: %+v; want still Resuming", got.Status)
			}
			if err := s.reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, _ = s.Get(sb.ID); got.Status.State != opensandbox.Resuming {
				t.Fatalf("after a reconcile during another replica's resume: %+v; want still Resuming", got.Status)
			}
			s.mu.Lock()
			e.rec.Status.LastTransitionAt = time.Now().Add(-createTimeout - 2*time.Second)
			s.mu.Unlock()
			s.resync()
			if got, _ = s.Get(sb.ID); got.Status.State != opensandbox.Failed {
				t.Fatalf("after a resync of a resume older than any can last: %+v; want Failed", got.Status)
			}
		})
	}
}
