package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// snapKube is kubeLike with snapshots, enabled or not (SnapshotChecker).
type snapKube struct {
	kubeLike
	err error
}

func (snapKube) Snapshot(context.Context, Instance, string, bool) (SnapshotArtifact, error) {
	return SnapshotArtifact{}, errors.New("not in this test")
}
func (snapKube) RemoveSnapshot(context.Context, string) error { return nil }
func (k snapKube) CanSnapshot() error                         { return k.err }

// sharedMem is a SharedSnapshotStore in memory, which two servers use at once.
type sharedMem struct {
	memStore
	mu   sync.Mutex
	docs map[string][]byte
}

func (m *sharedMem) PutSnapshot(id string, doc []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.docs[id] = doc
	return nil
}

func (m *sharedMem) DeleteSnapshot(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.docs, id)
	return nil
}

func (m *sharedMem) Snapshots() (map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range m.docs {
		out[k] = v
	}
	return out, nil
}

func (m *sharedMem) SharedSnapshots() bool { return true }

// TestSnapshotsShared: two servers on one shared snapshot store (two lifecycle replicas
// on Kubernetes) each see, and delete, the snapshots the other recorded; a Creating
// record of the other replica is left Creating at start. A Snapshotter whose
// CanSnapshot fails leaves the routes at 501.
func TestSnapshotsShared(t *testing.T) {
	st := &sharedMem{docs: map[string][]byte{}}
	now := time.Now().UTC()
	creating := snapshotRecord{ID: "snap-b", SandboxID: "sbx", CreatedAt: now,
		Status: SnapshotStatus{State: SnapshotCreating, LastTransitionAt: now}}
	b, _ := json.Marshal(creating)
	st.docs["snap-b"] = b
	a, err := New(Config{Runtime: snapKube{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.loadSnapshots(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sn, err := a.GetSnapshot(context.Background(), "snap-b"); err != nil || sn.Status.State != SnapshotCreating {
		t.Fatalf("another replica's Creating snapshot at start: %+v, %v; want it left Creating", sn, err)
	}
	ready := snapshotRecord{ID: "snap-c", SandboxID: "sbx", CreatedAt: now, Ref: "img",
		Status: SnapshotStatus{State: SnapshotReady, LastTransitionAt: now}}
	b, _ = json.Marshal(ready)
	_ = st.PutSnapshot("snap-c", b) // written by the other replica after a's start
	l, err := a.ListSnapshots(context.Background(), SnapshotFilter{SandboxID: "sbx", Page: 1, PageSize: 10})
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("list on a: %+v, %v; want both snapshots", l, err)
	}
	if err := a.DeleteSnapshot(context.Background(), "snap-c"); err != nil {
		t.Fatal(err)
	}
	_ = st.DeleteSnapshot("snap-b") // deleted through the other replica
	if _, err := a.GetSnapshot(context.Background(), "snap-b"); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("a snapshot the other replica deleted: %v, want ErrSnapshotNotFound", err)
	}

	off, err := New(Config{Runtime: snapKube{err: ErrNotImplemented}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	off.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/v1/snapshots", nil))
	if rec.Code != http.StatusNotImplemented {
		t.Fatalf("GET /v1/snapshots with snapshots off: %d %s, want 501", rec.Code, rec.Body)
	}
}
