package lifecycle

import "bytes"

// load adds every sandbox of the store that the registry does not hold yet and
// publishes it (a replica starting beside others: their sandboxes are already running
// and another replica leads).
func (s *Server) load() error {
	recs, err := allRecords(s.store)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range recs {
		if _, ok := s.sbx[rec.ID]; ok || rec.Pool != "" {
			continue
		}
		s.sbx[rec.ID] = &entry{rec: rec}
		s.hub.Put(s.watchView(rec))
	}
	s.log.Info("registry loaded from the shared store", "sandboxes", len(recs))
	return nil
}

// applyRemote takes in a change another replica wrote to the shared store: a new or
// changed sandbox (doc) or a deleted one (doc nil). The record is updated in place, so
// an operation of this replica holding it sees the change.
func (s *Server) applyRemote(id string, doc []byte) {
	if doc == nil {
		s.mu.Lock()
		_, ok := s.sbx[id]
		delete(s.sbx, id)
		s.mu.Unlock()
		if ok {
			s.hub.Delete(id)
			s.forgetVault(id)
			s.proxy.forget()
		}
		return
	}
	rec, err := decodeRecord(id, doc)
	if err != nil {
		s.log.Error("ignoring a sandbox document another replica wrote", "sandbox_id", id, "err", err)
		return
	}
	if rec.Pool != "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		e = &entry{rec: rec}
		s.sbx[id] = e
	} else {
		if cur, err := encodeRecord(e.rec); err == nil && bytes.Equal(cur, doc) {
			return
		}
		*e.rec = *rec
	}
	s.hub.Put(s.watchView(e.rec))
}
