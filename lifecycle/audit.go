package lifecycle

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
)

// AuditResponse is the answer of GET /v1/sandboxes/{id}/audit.
type AuditResponse struct {
	Records []audit.Record `json:"records"`
	// More is true when records beyond limit exist: ask again with after=<last seq>.
	More bool `json:"more"`
}

// auditAPI serves a sandbox's records from the audit log (GET /sandboxes/{id}/audit).
// It reads the log's files on every request.
type auditAPI struct {
	// dir is the audit log's directory (Config.AuditDir); empty answers 501.
	dir string
	log *slog.Logger
}

func (a *auditAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /sandboxes/{id}/audit", a.handle)
}

// handle answers GET /v1/sandboxes/{id}/audit?since=&until=&after=&limit= from the
// audit log: since and until are RFC 3339 times (since ≤ time < until), after a seq
// to continue from, limit at most 10000 (default 1000).
func (a *auditAPI) handle(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if a.dir == "" {
		fail(a.log, w, r, fmt.Errorf("%w: no audit log is configured", ErrNotImplemented))
		return
	}
	q := r.URL.Query()
	f := audit.Filter{SandboxID: id, Limit: 1000}
	for _, tf := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(tf.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				fail(a.log, w, r, fmt.Errorf("%w: %s must be an RFC 3339 time (2026-11-22T18:00:00Z)", ErrInvalidRequest, tf.name))
				return
			}
			*tf.dst = t
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(a.log, w, r, fmt.Errorf("%w: after must be a record seq", ErrInvalidRequest))
			return
		}
		f.AfterSeq = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			fail(a.log, w, r, fmt.Errorf("%w: limit must be from 1 to 10000", ErrInvalidRequest))
			return
		}
		f.Limit = n
	}
	recs, more, err := audit.Query(a.dir, f)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	if recs == nil {
		recs = []audit.Record{}
	}
	opensandbox.WriteJSON(w, http.StatusOK, AuditResponse{Records: recs, More: more})
}
