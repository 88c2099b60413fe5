package lifecycle

import (
	"encoding/json"
	"time"
)

// SharedSnapshotStore is a SnapshotStore that several lifecycle replicas write at once
// (kubestore: Secrets read from the API server). A server with one reads the store's
// records before it answers a snapshot request (syncSnapshots), so a snapshot taken
// through one replica is listed, read, restored and deleted through any other; and at
// start it leaves a Creating or Deleting record younger than a capture's deadline
// alone (another replica may be making or deleting it).
type SharedSnapshotStore interface {
	SnapshotStore
	// SharedSnapshots reports whether other replicas write the records too.
	SharedSnapshots() bool
}

// sharedSnapshots reports whether the store's snapshot records are shared.
func (s *Server) sharedSnapshots() bool {
	ss, ok := s.snaps.store.(SharedSnapshotStore)
	return ok && ss.SharedSnapshots()
}

// syncSnapshots merges the store's records into the registry when the store is shared:
// records another replica wrote are added or updated in place (a read older than this
// replica's own last change to a record is ignored), records gone from the store that
// this replica did not change since the read began are dropped.
func (s *Server) syncSnapshots() {
	if s.snaps.store == nil || !s.sharedSnapshots() {
		return
	}
	began := time.Now().UTC()
	docs, err := s.snaps.store.Snapshots()
	if err != nil {
		s.log.Warn("reading the shared snapshot records failed; answering from this replica's", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, doc := range docs {
		var r snapshotRecord
		if json.Unmarshal(doc, &r) != nil || r.ID != id {
			continue
		}
		cur, ok := s.snaps.byID[id]
		switch {
		case !ok:
			s.snaps.byID[id] = &r
		case !r.Status.LastTransitionAt.Before(cur.Status.LastTransitionAt):
			*cur = r // in place: a capture of this replica holds the pointer
		}
	}
	for id, cur := range s.snaps.byID {
		if _, ok := docs[id]; !ok && cur.Status.LastTransitionAt.Before(began) {
			delete(s.snaps.byID, id)
		}
	}
}
