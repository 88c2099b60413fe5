package gateway

import (
	"io"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/gateway/route"
	"github.com/airlockdev/airlock/internal/pathform"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// AuditSink receives one canonical record per request decision. Append is called on the
// request's goroutine after the response ends; it must not block for long (the audit
// writer batches and fsyncs on its own).
type AuditSink interface {
	Append(audit.Record)
}

// Keys of the gateway's audit.Record.Extra (bounded and documented, see audit.Record).
const (
	auditRoute      = "route"       // routing form: header, airlock_header, host, path_proxy, path
	auditStatus     = "status"      // HTTP status sent to the client (101 for upgrades)
	auditBytes      = "bytes"       // response body bytes written (not counting upgraded streams)
	auditDurationMS = "duration_ms" // whole request, including streaming
	auditRequestID  = "request_id"
	auditMethod     = "method"
	auditUpgrade    = "upgrade" // "websocket" when the request upgraded
	auditResult     = "result"  // proxied, not_found, unauthorized, ... (see metrics)
)

// record builds the audit record of one finished request.
func record(start time.Time, r *http.Request, dec *decision, res result, status int, bytes int64, reqID, client string) audit.Record {
	rec := audit.Record{
		Time:      start.UTC(),
		SandboxID: dec.cand.ID,
		Source:    audit.SourceGateway,
		Proto:     "http",
		Src:       client,
		DstHost:   r.Host,
		DstPort:   dec.cand.Port,
		Action:    "allow",
		Reason:    dec.access,
		Extra: map[string]any{
			auditRoute:      formValue(dec.cand.Form),
			auditStatus:     statusValue(status),
			auditBytes:      float64(bytes),
			auditDurationMS: float64(time.Since(start).Microseconds()) / 1000,
			auditRequestID:  reqID,
			auditMethod:     methodValue(r.Method),
			auditResult:     resultValues[res],
		},
	}
	if r.TLS != nil {
		rec.Proto = "https"
	}
	if dec.sb != nil {
		if dec.sb.Address.IsValid() {
			rec.DstIP = dec.sb.Address.String()
		} else if dec.sb.Address6.IsValid() {
			rec.DstIP = dec.sb.Address6.String()
		}
		rec.Rule = accessRule(dec.mode)
	}
	if c := dec.caller; c != nil && c.known {
		rec.Extra["principal"] = c.p.ID // who, never the key
	}
	if dec.err != nil {
		rec.Action = "deny"
		rec.Reason = dec.reason
		if res == resUnauthorized || res == resForbidden {
			rec.Source = audit.SourceIngress // a refused credential (never its value)
		}
	}
	if up := headerValue(r.Header, "Upgrade"); up != "" || r.Method == http.MethodConnect {
		if up == "" {
			up = r.Header.Get(":protocol")
		}
		rec.Extra[auditUpgrade] = up
	}
	return rec
}

// The values of a record that come from small fixed sets are boxed once here: putting
// a string into Extra (map[string]any) otherwise allocates per request. Numbers are
// float64, as the record reads back from its JSON (record.ReadBack): the export then
// reads the record as it is, without converting a copy of its Extra per request.
var (
	statusValues = func() (v [600]any) {
		for i := range v {
			v[i] = float64(i)
		}
		return v
	}()
	resultValues = func() (v [numResults]any) {
		for i := range v {
			v[i] = result(i).String()
		}
		return v
	}()
	formValues = func() (v [route.FormPath + 1]any) {
		for i := range v {
			v[i] = route.Form(i).String()
		}
		return v
	}()
)

// statusValue is an HTTP status as an Extra value (float64).
func statusValue(code int) any {
	if code >= 0 && code < len(statusValues) {
		return statusValues[code]
	}
	return float64(code)
}

// formValue is f's name as an Extra value.
func formValue(f route.Form) any {
	if f >= 0 && int(f) < len(formValues) {
		return formValues[f]
	}
	return f.String()
}

// methodValue is the request method as an Extra value: the common methods without an
// allocation (a constant in an interface is static), any other as it is.
func methodValue(m string) any {
	switch m {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPatch:
		return http.MethodPatch
	case http.MethodOptions:
		return http.MethodOptions
	}
	return m
}

// accessRule is the record's rule for an access mode: "access:<mode>".
func accessRule(m watch.AccessMode) string {
	switch m {
	case watch.Public:
		return "access:" + string(watch.Public)
	case watch.Token:
		return "access:" + string(watch.Token)
	case watch.Signed:
		return "access:" + string(watch.Signed)
	}
	return "access:" + string(m)
}

// headerValue is h.Get(key) for a key already in canonical form (no canonicalization).
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// clientAddr returns the client's address as Caddy determined it (trusted proxies
// honoured), falling back to the connection's remote address.
func clientAddr(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		if _, port, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			return net.JoinHostPort(ip, port)
		}
		return ip
	}
	return r.RemoteAddr
}

// recorder tracks the status and body size of a response without buffering it. It unwraps
// for http.ResponseController, so flushing and hijacking (WebSocket) reach the real writer.
type recorder struct {
	caddyhttp.ResponseWriterWrapper
	status int
	bytes  int64
	// hold499 keeps back reverse_proxy's 499 (request context ended before a response)
	// so the handler can answer 410 when the end was the sandbox's deletion.
	hold499 bool
	holding bool
	// prefix, when set, is the path prefix of a path-form route: the response headers
	// are hardened (pathform.Harden) once, before the final status goes out.
	prefix string
	// obs, when set, observes the response of an agent action through execd.
	obs *execdaudit.Action
}

func newRecorder(w http.ResponseWriter) *recorder {
	return &recorder{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

func (rr *recorder) WriteHeader(code int) {
	if code == 499 && rr.hold499 && rr.status == 0 {
		rr.holding = true
		return
	}
	if rr.obs != nil {
		rr.obs.WriteHeader(code)
	}
	if rr.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		rr.status = code
		if rr.prefix != "" {
			pathform.Harden(rr.Header(), rr.prefix)
		}
	}
	rr.ResponseWriterWrapper.WriteHeader(code)
}

func (rr *recorder) Write(b []byte) (int, error) {
	if rr.status == 0 {
		rr.WriteHeader(http.StatusOK)
	}
	n, err := rr.ResponseWriterWrapper.Write(b)
	rr.bytes += int64(n)
	if rr.obs != nil {
		rr.obs.Write(b[:n])
	}
	return n, err
}

// ReadFrom keeps the underlying writer's fast path while counting bytes.
func (rr *recorder) ReadFrom(r io.Reader) (int64, error) {
	if rr.status == 0 {
		rr.WriteHeader(http.StatusOK)
	}
	if rr.obs != nil {
		r = io.TeeReader(r, observed{rr.obs})
	}
	n, err := rr.ResponseWriterWrapper.ReadFrom(r)
	rr.bytes += n
	return n, err
}

func (rr *recorder) wroteHeader() bool { return rr.status != 0 || rr.holding }

// held reports whether a 499 is being held back.
func (rr *recorder) held() bool { return rr.holding }

// release writes the held 499.
func (rr *recorder) release() {
	rr.holding, rr.hold499 = false, false
	rr.WriteHeader(499)
}

// observed is an io.Writer that shows bytes to an Action.
type observed struct{ a *execdaudit.Action }

func (o observed) Write(p []byte) (int, error) {
	o.a.Write(p)
	return len(p), nil
}

var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ io.ReaderFrom       = (*recorder)(nil)
)
