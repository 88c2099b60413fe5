package console

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
)

// recordFilter is the console's filter on audit records beyond audit.Filter: action,
// source, a host substring (dst_host or dst_ip) and the principal (extra.principal of
// control-plane records and agent actions), all optional.
type recordFilter struct {
	Action, Source, Host, Principal string
}

func filterFrom(r *http.Request) recordFilter {
	q := r.URL.Query()
	return recordFilter{Action: q.Get("action"), Source: q.Get("source"), Host: strings.ToLower(strings.TrimSpace(q.Get("host"))),
		Principal: strings.TrimSpace(q.Get("principal"))}
}

func (f recordFilter) match(rec audit.Record) bool {
	if f.Principal != "" && !(audit.Selector{Principal: f.Principal}).Match(&rec) {
		return false
	}
	if f.Action != "" && rec.Action != f.Action {
		return false
	}
	if f.Source != "" && string(rec.Source) != f.Source {
		return false
	}
	if f.Host != "" && !strings.Contains(strings.ToLower(rec.DstHost), f.Host) && !strings.Contains(rec.DstIP, f.Host) {
		return false
	}
	return true
}

func (c *Console) needAudit(w http.ResponseWriter) bool {
	if c.cfg.AuditDir == "" {
		writeError(w, http.StatusNotImplemented, "NOT_IMPLEMENTED", "no audit log is configured")
		return false
	}
	return true
}

// streamBacklog is how many recent records a new live stream starts with.
const streamBacklog = 50

// streamPoll is how often the live stream reads the audit log for new records.
const streamPoll = 200 * time.Millisecond

// streamKeepalive is how often an idle stream sends a comment (and checks the session).
const streamKeepalive = 15 * time.Second

// handleEvents streams a sandbox's audit records as Server-Sent Events
// (https://html.spec.whatwg.org/multipage/server-sent-events.html): first the last
// streamBacklog records matching the filter, then every new one within streamPoll of its
// write. Each event is `id: <seq>`, `event: record`, `data: <record JSON>`; a reconnect
// with Last-Event-ID continues after that seq. The stream ends with `event: expired`
// when the session does.
func (c *Console) handleEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := c.auditedSandbox(w, r)
	if !ok {
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "streaming is not supported here")
		return
	}
	f := filterFrom(r)
	base := audit.Filter{SandboxID: id}
	after, _ := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64)
	var backlog []audit.Record
	if after == 0 {
		recs, err := audit.Tail(c.cfg.AuditDir, 4*streamBacklog, base)
		if err != nil {
			c.log.Error("reading the audit log failed", "err", err)
			writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "reading the audit log failed")
			return
		}
		// Follow continues after the sandbox's newest record, matching or not. (A
		// sandbox without records yet is followed from the log's end.)
		if len(recs) > 0 {
			after = recs[len(recs)-1].Seq
		}
		for _, rec := range recs {
			if f.match(rec) {
				backlog = append(backlog, rec)
			}
		}
		backlog = backlog[max(0, len(backlog)-streamBacklog):]
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	send := func(rec audit.Record) error {
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		fmt.Fprintf(bw, "id: %d\nevent: record\ndata: %s\n\n", rec.Seq, b)
		return nil
	}
	fmt.Fprint(bw, "retry: 1000\n\n")
	for _, rec := range backlog {
		if err := send(rec); err != nil {
			return
		}
	}
	fmt.Fprint(bw, "event: ready\ndata: {}\n\n")
	if bw.Flush() != nil {
		return
	}
	fl.Flush()

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	recs := make(chan audit.Record, 256)
	go func() {
		defer close(recs)
		base.AfterSeq = after
		err := audit.Follow(ctx, c.cfg.AuditDir, base, streamPoll, func(rec audit.Record) error {
			if !f.match(rec) {
				return nil
			}
			select {
			case recs <- rec:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("following the audit log failed", "sandbox_id", id, "err", err)
		}
	}()
	sess := sessionOf(r)
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.closed:
			return
		case rec, ok := <-recs:
			if !ok {
				return
			}
			if send(rec) != nil {
				return
			}
			// Drain what is already queued into the same write.
			for more := true; more; {
				select {
				case rec, ok := <-recs:
					if !ok {
						more = false
						break
					}
					if send(rec) != nil {
						return
					}
				default:
					more = false
				}
			}
		case <-tick.C:
			if !c.cfg.Now().Before(sess.expires) || !c.refresh(sess) {
				fmt.Fprint(bw, "event: expired\ndata: {}\n\n")
				_ = bw.Flush()
				fl.Flush()
				return
			}
			fmt.Fprint(bw, ": keepalive\n\n")
		}
		if bw.Flush() != nil {
			return
		}
		fl.Flush()
	}
}

// searchLimit bounds one page of GET /console/api/audit.
const searchLimit = 500

// handleAuditSearch answers GET /console/api/audit?sandbox=&since=&until=&action=
// &source=&host=&after=&limit=: {"records":[…],"more":bool} in seq order (continue with
// after=<last seq>).
func (c *Console) handleAuditSearch(w http.ResponseWriter, r *http.Request) {
	if !c.needAudit(w) {
		return
	}
	af, f, limit, err := searchParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	recs := []audit.Record{}
	more := false
	errFull := errors.New("full")
	err = audit.Scan(c.cfg.AuditDir, af, func(rec audit.Record) error {
		if !f.match(rec) {
			return nil
		}
		if len(recs) == limit {
			more = true
			return errFull
		}
		recs = append(recs, rec)
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		c.log.Error("searching the audit log failed", "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "reading the audit log failed")
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, map[string]any{"records": recs, "more": more})
}

func searchParams(r *http.Request) (audit.Filter, recordFilter, int, error) {
	q := r.URL.Query()
	af := audit.Filter{SandboxID: strings.TrimSpace(q.Get("sandbox"))}
	var err error
	if af.Since, err = parseTime(q.Get("since"), "since"); err != nil {
		return af, recordFilter{}, 0, err
	}
	if af.Until, err = parseTime(q.Get("until"), "until"); err != nil {
		return af, recordFilter{}, 0, err
	}
	if !af.Since.IsZero() && !af.Until.IsZero() && !af.Since.Before(af.Until) {
		return af, recordFilter{}, 0, errors.New("since must be before until")
	}
	if v := q.Get("after"); v != "" {
		if af.AfterSeq, err = strconv.ParseUint(v, 10, 64); err != nil {
			return af, recordFilter{}, 0, errors.New("after must be a record seq")
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > searchLimit {
			return af, recordFilter{}, 0, fmt.Errorf("limit must be from 1 to %d", searchLimit)
		}
	}
	return af, filterFrom(r), limit, nil
}

// handleVerify answers GET /console/api/audit/verify with audit.Verify's report and
// {"ok": bool, "error": "..."}: the chain's status.
func (c *Console) handleVerify(w http.ResponseWriter, r *http.Request) {
	if !c.needAudit(w) {
		return
	}
	rep, err := audit.Verify(c.cfg.AuditDir, audit.VerifyOptions{PublicKey: c.cfg.AuditPublicKey})
	out := map[string]any{"ok": err == nil && rep != nil && rep.Broken == nil, "report": rep, "checkedAt": c.cfg.Now().UTC()}
	if err != nil {
		out["error"] = err.Error()
	}
	opensandbox.WriteJSON(w, http.StatusOK, out)
}

// handleExport answers GET /console/api/audit/export?since=&until=&sandbox=&action=
// &source=&host= with the matching records as a JSON Lines download (each line the
// record as the log holds it, chain fields included).
func (c *Console) handleExport(w http.ResponseWriter, r *http.Request) {
	if !c.needAudit(w) {
		return
	}
	af, f, _, err := searchParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	name := "airlock-audit"
	if af.SandboxID != "" {
		name += "-" + sanitizeName(af.SandboxID)
	}
	if !af.Since.IsZero() {
		name += "-" + af.Since.UTC().Format("20060102T150405Z")
	}
	w.Header().Set("Content-Type", "application/jsonl; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.jsonl"`)
	bw := bufio.NewWriterSize(w, 64<<10)
	n := 0
	err = audit.Scan(c.cfg.AuditDir, af, func(rec audit.Record) error {
		if !f.match(rec) {
			return nil
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		n++
		_, _ = bw.Write(b)
		return bw.WriteByte('\n')
	})
	if err != nil {
		c.log.Error("exporting the audit log failed", "records", n, "err", err)
	}
	_ = bw.Flush()
}

func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s)
}

// auditedSandbox is the path's sandbox id for a view of its audit records, once the
// console has an audit log and the API shows the sandbox to the session's key (a user
// sees its own only); otherwise it has answered the error and ok is false.
func (c *Console) auditedSandbox(w http.ResponseWriter, r *http.Request) (id string, ok bool) {
	if !c.needAudit(w) {
		return "", false
	}
	id = r.PathValue("id")
	var sb struct{ ID string }
	if err := c.apiGet(r.Context(), "/v1/sandboxes/"+id, &sb); err != nil {
		writeAPIError(w, err)
		return "", false
	}
	return id, true
}
