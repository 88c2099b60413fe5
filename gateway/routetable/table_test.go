package routetable

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/lifecycle/watch"
)

func sandbox(id string, n int) watch.Sandbox {
	return watch.Sandbox{ID: id, State: "Running", Address: netip.AddrFrom4([4]byte{10, 0, byte(n >> 8), byte(n)})}
}

func TestUpsertDeleteReplace(t *testing.T) {
	var sizes []int
	tab := New(Config{OnChange: func(n int) { sizes = append(sizes, n) }})
	tab.Upsert(sandbox("a", 1), 1)
	tab.Upsert(sandbox("b", 2), 2)
	ea, ok := tab.Lookup("a")
	if !ok || ea.Sandbox().Address != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("lookup a: %v %+v", ok, ea)
	}
	if !ea.Acquire(0) {
		t.Fatal("acquire without limit refused")
	}
	// A new version keeps the entry, its counters and its context.
	mod := sandbox("a", 9)
	mod.State = "Paused"
	tab.Upsert(mod, 3)
	ea2, _ := tab.Lookup("a")
	if ea2 != ea || ea2.Sandbox().State != "Paused" || ea2.Conns() != 1 {
		t.Fatalf("upsert replaced the entry or lost counters: same=%v state=%s conns=%d", ea2 == ea, ea2.Sandbox().State, ea2.Conns())
	}
	ea.Release()

	tab.Delete("a", 4)
	if _, ok := tab.Lookup("a"); ok {
		t.Fatal("deleted sandbox still found")
	}
	if ea.Context().Err() == nil {
		t.Fatal("deleted entry's context not cancelled")
	}
	if !tab.Gone("a", time.Now()) || tab.Gone("b", time.Now()) || tab.Gone("never", time.Now()) {
		t.Fatal("tombstones wrong")
	}
	// Replace: b disappears (gone), c appears, a comes back (tombstone cleared).
	tab.Replace([]watch.Sandbox{sandbox("c", 3), sandbox("a", 1)}, 10)
	if _, ok := tab.Lookup("b"); ok || !tab.Gone("b", time.Now()) {
		t.Fatal("b should be gone after a snapshot without it")
	}
	if tab.Gone("a", time.Now()) {
		t.Fatal("re-added a still has a tombstone")
	}
	if tab.Len() != 2 || tab.ResourceVersion() != 10 {
		t.Fatalf("len %d rv %d", tab.Len(), tab.ResourceVersion())
	}
	if fmt.Sprint(sizes) != "[1 2 2 1 2]" {
		t.Fatalf("OnChange sizes %v", sizes)
	}
}

func TestTombstoneBounds(t *testing.T) {
	tab := New(Config{TombstoneTTL: time.Hour, MaxTombstones: 3})
	for i := range 5 {
		id := fmt.Sprint("s", i)
		tab.Upsert(sandbox(id, i), uint64(2*i+1))
		tab.Delete(id, uint64(2*i+2))
	}
	now := time.Now()
	for i := range 5 {
		if got, want := tab.Gone(fmt.Sprint("s", i), now), i >= 2; got != want {
			t.Errorf("s%d gone=%v, want %v (bound 3)", i, got, want)
		}
	}
	if tab.Gone("s4", now.Add(2*time.Hour)) {
		t.Error("tombstone outlived its TTL")
	}
}

func TestAcquireLimit(t *testing.T) {
	tab := New(Config{})
	tab.Upsert(sandbox("a", 1), 1)
	e, _ := tab.Lookup("a")
	for i := range 3 {
		if !e.Acquire(3) {
			t.Fatalf("acquire %d refused under limit 3", i)
		}
	}
	if e.Acquire(3) {
		t.Fatal("fourth acquire allowed with limit 3")
	}
	e.Release()
	if !e.Acquire(3) {
		t.Fatal("acquire after release refused")
	}
}

func TestClaimRenew(t *testing.T) {
	tab := New(Config{})
	tab.Upsert(sandbox("a", 1), 1)
	e, _ := tab.Lookup("a")
	t0 := time.Unix(1_900_000_000, 0)
	if !e.ClaimRenew(t0, time.Minute) {
		t.Fatal("first claim refused")
	}
	if e.ClaimRenew(t0.Add(59*time.Second), time.Minute) {
		t.Fatal("second claim within the interval allowed")
	}
	if !e.ClaimRenew(t0.Add(time.Minute), time.Minute) {
		t.Fatal("claim after the interval refused")
	}
	// Concurrent claimers: exactly one wins.
	var wins atomic.Int32
	var wg sync.WaitGroup
	t1 := t0.Add(time.Hour)
	for range 16 {
		wg.Go(func() {
			if e.ClaimRenew(t1, time.Minute) {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d concurrent claims won, want 1", wins.Load())
	}
}

// TestConcurrentUpdates runs readers against a writer that upserts, modifies, deletes and
// replaces; run with -race. Readers must always see a complete entry for the id they asked.
func TestConcurrentUpdates(t *testing.T) {
	const ids = 200
	tab := New(Config{})
	stop := make(chan struct{})
	var bad atomic.Int64
	var reads atomic.Int64
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprint("s", i%ids)
				if e, ok := tab.Lookup(id); ok {
					sb := e.Sandbox()
					if sb == nil || sb.ID != id || !sb.Address.IsValid() {
						bad.Add(1)
					}
					if e.Acquire(1000) {
						e.Release()
					}
					_ = e.Context().Err()
				} else {
					_ = tab.Gone(id, time.Now())
				}
				reads.Add(1)
			}
		})
	}
	rv := uint64(0)
	for round := range 50 {
		for i := range ids {
			rv++
			tab.Upsert(sandbox(fmt.Sprint("s", i), i+round), rv)
		}
		for i := 0; i < ids; i += 3 {
			rv++
			tab.Delete(fmt.Sprint("s", i), rv)
		}
		if round%10 == 9 {
			all := make([]watch.Sandbox, 0, ids/2)
			for i := 0; i < ids; i += 2 {
				all = append(all, sandbox(fmt.Sprint("s", i), i))
			}
			rv++
			tab.Replace(all, rv)
		}
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d reads saw an inconsistent entry", bad.Load())
	}
	// Final state: the last round (49) ended with a snapshot of the even ids.
	want := 0
	for i := range ids {
		_, ok := tab.Lookup(fmt.Sprint("s", i))
		if ok != (i%2 == 0) {
			t.Fatalf("s%d present=%v", i, ok)
		}
		if ok {
			want++
		}
	}
	if tab.Len() != want {
		t.Fatalf("Len %d, want %d", tab.Len(), want)
	}
	t.Logf("%d concurrent reads", reads.Load())
}

func BenchmarkLookup10k(b *testing.B) {
	tab := New(Config{})
	all := make([]watch.Sandbox, 10_000)
	for i := range all {
		all[i] = sandbox(fmt.Sprintf("sandbox-%05d", i), i)
	}
	tab.Replace(all, 1)
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			e, ok := tab.Lookup(all[i%len(all)].ID)
			if !ok || e.Sandbox() == nil {
				b.Fatal("miss")
			}
			i++
		}
	})
}
