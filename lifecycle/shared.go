package lifecycle

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"time"
)

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
		if rec.Pool != "" {
			// The leader's warm pool member: published (egressd, which may follow this
			// replica, enforces it), never served.
			s.hub.Put(s.watchView(rec))
			continue
		}
		if _, ok := s.sbx[rec.ID]; ok {
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
		s.hub.Delete(id) // also a warm pool member's view (not in s.sbx)
		if ok {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec.Pool != "" {
		// The leader's warm pool member: published for the data plane (egressd may
		// follow this replica's watch), invisible to the API. A member this replica
		// already serves as a sandbox (claimed here) is a stale document.
		if _, claimed := s.sbx[id]; !claimed {
			s.hub.Put(s.watchView(rec))
		}
		return
	}
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

// catchUpTimeout bounds the store read of catchUp.
const catchUpTimeout = 5 * time.Second

// catchUp makes sure the sandbox a request names is in this replica's registry when it
// exists in the shared store (SandboxFetcher): without it a client that creates a
// sandbox through one replica and asks another right away gets 404 until that replica's
// watch delivers the sandbox. It only reads the store when the id is unknown here, and
// only for requests that passed the API key (Handler). Errors are logged; the request
// then proceeds as if the sandbox were unknown.
func (s *Server) catchUp(r *http.Request) {
	f, ok := s.store.(SandboxFetcher)
	if !ok {
		return
	}
	id := sandboxIDOf(r.URL.Path)
	if id == "" || s.peek(id, func(*record) {}) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), catchUpTimeout)
	defer cancel()
	doc, err := f.FetchSandbox(ctx, id)
	if err != nil {
		s.log.Warn("reading a sandbox this replica does not know yet", "sandbox_id", id, "err", err)
		return
	}
	if doc == nil {
		return
	}
	rec, err := decodeRecord(id, doc)
	if err != nil || rec.Pool != "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sbx[id]; ok {
		return // Follow delivered it meanwhile, possibly newer
	}
	s.sbx[id] = &entry{rec: rec}
	s.hub.Put(s.watchView(rec))
}

// sandboxIDOf returns the {id} of a path under /sandboxes/{id} ("" otherwise); the /v1
// prefix is already gone (Handler).
func sandboxIDOf(p string) string {
	rest, ok := strings.CutPrefix(p, "/sandboxes/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	if id == "" || len(id) > 64 {
		return ""
	}
	return id
}
