package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// maxBody caps request bodies of the JSON routes.
const maxBody = 1 << 20

// routes mounts the API on s.mux: the sandbox routes served here, the policy, library,
// audit and diagnostics APIs, the server proxy and the watch stream.
func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		opensandbox.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	m.HandleFunc("POST /metrics/events", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBody))
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("POST /sandboxes", s.handleCreate)
	m.HandleFunc("GET /sandboxes", s.handleList)
	m.HandleFunc("GET /sandboxes/{id}", s.handleGet)
	m.HandleFunc("DELETE /sandboxes/{id}", s.handleDelete)
	m.HandleFunc("PATCH /sandboxes/{id}/metadata", s.handlePatchMetadata)
	m.HandleFunc("POST /sandboxes/{id}/pause", s.handlePause)
	m.HandleFunc("POST /sandboxes/{id}/resume", s.handleResume)
	m.HandleFunc("POST /sandboxes/{id}/renew-expiration", s.handleRenew)
	m.HandleFunc("GET /sandboxes/{id}/endpoints/{port}", s.handleEndpoint)
	m.HandleFunc("POST /sandboxes/{id}/signed-urls/revoke", s.handleRevokeSignedURLs)
	s.policies.routes(m)
	(&libraryAPI{lib: s.lib, reg: s, log: s.log}).routes(m)
	(&auditAPI{dir: s.cfg.AuditDir, log: s.log}).routes(m)
	(&proposalAPI{pol: s.policies, reg: s, lib: s.cfg.Library, dir: s.cfg.AuditDir, floor: s.cfg.Floor}).routes(m)
	(&keysAPI{keys: s.keys, log: s.log}).routes(m)
	diag, _ := s.rt.(Diagnoser)
	(&diagnosticsAPI{
		reg: s, rt: diag, kind: s.rt.Kind(), cfg: s.cfg.Diagnostics, key: s.cfg.ExecdKey,
		publicAddr: s.cfg.PublicAddr, log: s.log,
	}).routes(m)
	s.snapshotRoutes(m)
	m.HandleFunc(proxyPattern, s.proxy.handle)
	m.HandleFunc(proxyRestPattern, s.proxy.handle)
	m.Handle("GET /internal/v1/watch", s.hub)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(s.log, w, r, fmt.Errorf("%w: %s %s", ErrNoRoute, r.Method, r.URL.Path))
	})
}

// decode reads one JSON value of at most maxBody bytes into v.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: the body is empty", ErrInvalidJSON)
		}
		return fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: unexpected data after the JSON value", ErrInvalidJSON)
	}
	return nil
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decode(r, &req); err != nil {
		fail(s.log, w, r, err)
		return
	}
	if n, err := forkCount(&req); err != nil || n > 0 {
		if err != nil {
			fail(s.log, w, r, err)
			return
		}
		fr, err := s.Fork(r.Context(), &req, n)
		if err != nil {
			fail(s.log, w, r, err)
			return
		}
		w.Header().Set("Location", "/v1/sandboxes/"+fr.ID)
		opensandbox.WriteJSON(w, http.StatusAccepted, fr)
		return
	}
	sb, err := s.Create(r.Context(), &req) // the owner is the context's principal
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	opensandbox.WriteJSON(w, http.StatusAccepted, sb)
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Get(r.PathValue("id"))
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, sb)
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := ListFilter{Page: 1, PageSize: 20}
	if p := principalOf(r); p.Role != "" && !p.Role.OwnsAll() {
		f.Owner = p.ID // a user lists its own sandboxes only
	}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			if one = strings.TrimSpace(one); one != "" {
				f.States = append(f.States, one)
			}
		}
	}
	if md := q.Get("metadata"); md != "" {
		pairs, err := url.ParseQuery(md)
		if err != nil {
			fail(s.log, w, r, fmt.Errorf("%w: metadata filter %q: want url-encoded k=v&k2=v2", ErrInvalidRequest, md))
			return
		}
		f.Metadata = map[string]string{}
		for k, vs := range pairs {
			f.Metadata[k] = vs[len(vs)-1]
		}
	}
	var err error
	if f.Page, err = intParam(q, "page", 1, 1, 1<<31-1); err != nil {
		fail(s.log, w, r, err)
		return
	}
	if f.PageSize, err = intParam(q, "pageSize", 20, 1, 1000); err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, s.List(f))
}

func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s must be a whole number from %d to %d", ErrInvalidRequest, name, lo, hi)
	}
	return n, nil
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.Delete(r.Context(), r.PathValue("id"), "user_delete"); err != nil {
		fail(s.log, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handlePatchMetadata(w http.ResponseWriter, r *http.Request) {
	var patch map[string]*string
	if err := decode(r, &patch); err != nil {
		fail(s.log, w, r, err)
		return
	}
	sb, err := s.PatchMetadata(r.PathValue("id"), patch)
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, sb)
}

// accepted answers 202 with an explicit empty body (the SDK parses any other body).
func accepted(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) {
	if err := s.Pause(r.Context(), r.PathValue("id")); err != nil {
		fail(s.log, w, r, err)
		return
	}
	accepted(w)
}

func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) {
	if err := s.Resume(r.Context(), r.PathValue("id")); err != nil {
		fail(s.log, w, r, err)
		return
	}
	accepted(w)
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request) {
	var req RenewRequest
	if err := decode(r, &req); err != nil {
		fail(s.log, w, r, err)
		return
	}
	if req.ExpiresAt == nil {
		fail(s.log, w, r, fmt.Errorf("%w: expiresAt (RFC 3339) is required", ErrInvalidRequest))
		return
	}
	at, err := s.Renew(r.PathValue("id"), *req.ExpiresAt)
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, RenewResponse{ExpiresAt: at})
}

func (s *Server) handleEndpoint(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		fail(s.log, w, r, fmt.Errorf("%w: port must be a number from 1 to 65535", ErrInvalidRequest))
		return
	}
	serverProxy := false
	if v := r.URL.Query().Get("use_server_proxy"); v != "" {
		if serverProxy, err = strconv.ParseBool(v); err != nil {
			fail(s.log, w, r, fmt.Errorf("%w: use_server_proxy must be true or false", ErrInvalidRequest))
			return
		}
	}
	er := EndpointRequest{HTTP: r, ID: r.PathValue("id"), Port: port, ServerProxy: serverProxy}
	if v := r.URL.Query().Get("expires"); v != "" {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil || len(v) > 20 || (len(v) > 1 && v[0] == '0') {
			fail(s.log, w, r, fmt.Errorf("%w: expires must be Unix seconds (a decimal number)", ErrInvalidRequest))
			return
		}
		if serverProxy {
			fail(s.log, w, r, fmt.Errorf("%w: expires cannot be combined with use_server_proxy=true", ErrInvalidRequest))
			return
		}
		at := time.Unix(int64(min(secs, 1<<62)), 0).UTC()
		if limit := s.cfg.MaxSignedURLLifetime; time.Until(at) > limit {
			fail(s.log, w, r, fmt.Errorf("%w: expires is more than the maximum signed URL lifetime (%s) from now", ErrInvalidRequest, limit))
			return
		}
		er.Expires = &at
	}
	ep, err := s.Endpoint(er)
	if err != nil {
		fail(s.log, w, r, err)
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, ep)
}
