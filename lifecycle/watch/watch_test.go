package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a Handler that keeps the set and counts snapshots.
type recorder struct {
	mu       sync.Mutex
	set      map[string]Sandbox
	replaces int
	rv       uint64
}

func (r *recorder) Replace(all []Sandbox, rv uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = make(map[string]Sandbox)
	for _, s := range all {
		r.set[s.ID] = s
	}
	r.replaces++
	r.rv = rv
}

func (r *recorder) Upsert(s Sandbox, rv uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set[s.ID] = s
	r.rv = rv
}

func (r *recorder) Delete(id string, rv uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.set, id)
	r.rv = rv
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (r *recorder) snapshots() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replaces
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// switchable serves whichever hub is current and can cut every open stream.
type switchable struct {
	hub   atomic.Pointer[Hub]
	mu    sync.Mutex
	conns []context.CancelFunc
}

func (s *switchable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	s.mu.Lock()
	s.conns = append(s.conns, cancel)
	s.mu.Unlock()
	s.hub.Load().ServeHTTP(w, r.WithContext(ctx))
}

func (s *switchable) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c()
	}
	s.conns = nil
}

func sb(id, state string) Sandbox {
	return Sandbox{ID: id, State: state, Address: netip.MustParseAddr("10.0.0.2")}
}

func TestSnapshotDeltasAndResume(t *testing.T) {
	hub := NewHub(0, nil)
	hub.Put(sb("a", "Running"))
	hub.Put(sb("b", "Running"))
	hub.Put(sb("c", "Pending"))

	sw := &switchable{}
	sw.hub.Store(hub)
	srv := httptest.NewServer(sw)
	defer srv.Close()

	c, err := NewClient(ClientConfig{URL: srv.URL + "/watch", MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{set: map[string]Sandbox{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx, rec)

	eventually(t, "snapshot", func() bool { return slices.Equal(rec.ids(), []string{"a", "b", "c"}) })
	if !c.Status().Synced {
		t.Fatal("client not synced after snapshot")
	}

	hub.Put(sb("c", "Running"))
	hub.Delete("a")
	hub.Put(sb("d", "Pending"))
	eventually(t, "deltas", func() bool { return slices.Equal(rec.ids(), []string{"b", "c", "d"}) })
	rec.mu.Lock()
	if rec.set["c"].State != "Running" {
		t.Errorf("c state = %q, want Running", rec.set["c"].State)
	}
	rec.mu.Unlock()

	// A Put that changes nothing publishes nothing.
	before := hub.ResourceVersion()
	hub.Put(sb("c", "Running"))
	if hub.ResourceVersion() != before {
		t.Errorf("identical Put bumped the resource version")
	}

	// Cut the stream, change while disconnected: the client resumes with deltas only.
	sw.cut()
	hub.Delete("b")
	hub.Put(sb("e", "Running"))
	eventually(t, "resume", func() bool { return slices.Equal(rec.ids(), []string{"c", "d", "e"}) })
	if n := rec.snapshots(); n != 1 {
		t.Errorf("resume within history took %d snapshots, want 1 (the first)", n)
	}

	// A new server epoch (lifecycle restarted) forces a full snapshot.
	hub2 := NewHub(0, nil)
	hub2.Put(sb("x", "Running"))
	sw.hub.Store(hub2)
	sw.cut()
	eventually(t, "snapshot after epoch change", func() bool { return slices.Equal(rec.ids(), []string{"x"}) })
	if n := rec.snapshots(); n != 2 {
		t.Errorf("snapshots = %d, want 2", n)
	}
}

func TestFallingBehindHistoryResnapshots(t *testing.T) {
	hub := NewHub(4, nil)
	hub.Put(sb("a", "Running"))
	sw := &switchable{}
	sw.hub.Store(hub)
	srv := httptest.NewServer(sw)
	defer srv.Close()

	c, _ := NewClient(ClientConfig{URL: srv.URL, MaxBackoff: 50 * time.Millisecond})
	rec := &recorder{set: map[string]Sandbox{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx, rec)
	eventually(t, "snapshot", func() bool { return rec.snapshots() == 1 })

	// Stop the client from reading while more than the history changes.
	cancel()
	time.Sleep(20 * time.Millisecond)
	for i := range 10 {
		hub.Put(sb("a", []string{"Paused", "Running"}[i%2]))
	}
	hub.Put(sb("z", "Running"))

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go c.Run(ctx2, rec)
	eventually(t, "resnapshot", func() bool { return rec.snapshots() == 2 })
	if got := rec.ids(); !slices.Equal(got, []string{"a", "z"}) {
		t.Errorf("ids after resnapshot = %v", got)
	}
}

func TestNewClientRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x/y", "http://"} {
		if _, err := NewClient(ClientConfig{URL: u}); err == nil {
			t.Errorf("NewClient(%q) accepted a bad URL", u)
		}
	}
}

func TestAccessModeFor(t *testing.T) {
	a := Access{Mode: Token, Ports: map[int]AccessMode{8080: Public}}
	if a.ModeFor(8080) != Public || a.ModeFor(44772) != Token {
		t.Errorf("ModeFor: got %s/%s", a.ModeFor(8080), a.ModeFor(44772))
	}
	if (Access{}).ModeFor(1) != Public {
		t.Error("empty Access must be public")
	}
}

// TestFallbackURL: while the first URL refuses (here 503, as a Service without a ready
// leader answers nothing), the client follows FallbackURL; its stream there ends after
// FallbackTime and the client goes back to the first URL once that answers.
func TestFallbackURL(t *testing.T) {
	leader, replica := NewHub(0, nil), NewHub(0, nil)
	leader.Put(sb("a", "Running"))
	replica.Put(sb("a", "Running"))
	replica.Put(sb("b", "Running"))
	var up atomic.Bool
	first := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "no leader", http.StatusServiceUnavailable)
			return
		}
		leader.ServeHTTP(w, r)
	}))
	defer first.Close()
	fallback := httptest.NewServer(replica)
	defer fallback.Close()
	c, err := NewClient(ClientConfig{URL: first.URL + "/watch", FallbackURL: fallback.URL + "/watch",
		FallbackTime: 300 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{set: map[string]Sandbox{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx, rec)
	eventually(t, "the fallback's snapshot", func() bool { return slices.Equal(rec.ids(), []string{"a", "b"}) })
	replica.Put(sb("c", "Running"))
	eventually(t, "the fallback's delta", func() bool { return slices.Equal(rec.ids(), []string{"a", "b", "c"}) })
	up.Store(true)
	eventually(t, "the first URL's snapshot", func() bool { return slices.Equal(rec.ids(), []string{"a"}) })
	leader.Put(sb("d", "Running"))
	eventually(t, "the first URL's delta", func() bool { return slices.Equal(rec.ids(), []string{"a", "d"}) })
	if _, err := NewClient(ClientConfig{URL: first.URL, FallbackURL: "ftp://x"}); err == nil {
		t.Fatal("a bad fallback URL was accepted")
	}
}
