package lifecycle

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// controlOps names the control-plane call of each mutating route pattern (extra.op of
// its record, audit/README.md "Control-plane records"). A mutating pattern missing here
// (one another component mounted with Server.Handle) is recorded as "api.other".
var controlOps = map[string]string{
	"POST /sandboxes":                         "sandbox.create",
	"DELETE /sandboxes/{id}":                  "sandbox.delete",
	"PATCH /sandboxes/{id}/metadata":          "sandbox.metadata",
	"POST /sandboxes/{id}/pause":              "sandbox.pause",
	"POST /sandboxes/{id}/resume":             "sandbox.resume",
	"POST /sandboxes/{id}/renew-expiration":   "sandbox.renew",
	"GET /sandboxes/{id}/endpoints/{port}":    "signed_url.mint",
	"POST /sandboxes/{id}/signed-urls/revoke": "signed_url.revoke",
	"PUT /sandboxes/{id}/policy":              "policy.put",
	"PATCH /sandboxes/{id}/policy":            "policy.patch",
	"DELETE /sandboxes/{id}/policy":           "policy.delete",
	"POST /sandboxes/{id}/policy/proposal":    "policy.proposal",
	"POST /sandboxes/{id}/snapshots":          "snapshot.create",
	"DELETE /snapshots/{sid}":                 "snapshot.delete",
	"POST /keys":                              "key.create",
	"DELETE /keys/{id}":                       "key.revoke",
	"POST /keys/{id}/rotate":                  "key.rotate",
}

// controlNote is what the request's handlers tell the control record of their request
// (a pointer in the request's context, controlNoteKey): the principal the server proxy
// admitted, which Handler cannot see, and fields only the handler knows (extra, added
// to the record's extra: a proposal's decision, the library policy it wrote).
type controlNote struct {
	who   principal.Principal
	extra map[string]any
}

type controlNoteKey struct{}

// noteProxyPrincipal tells the control record of r (an egress API call through the
// server proxy) the principal the proxy admitted.
func noteProxyPrincipal(r *http.Request, who principal.Principal) {
	if n, ok := r.Context().Value(controlNoteKey{}).(*controlNote); ok {
		n.who = who
	}
}

// noteControl adds key=value to the extra of r's control record (when r is recorded).
// Values are what a record may hold: never a key or a vault value.
func noteControl(r *http.Request, key string, value any) {
	if n, ok := r.Context().Value(controlNoteKey{}).(*controlNote); ok {
		if n.extra == nil {
			n.extra = map[string]any{}
		}
		n.extra[key] = value
	}
}

// isMutating reports whether method changes state (the methods the records cover).
func isMutating(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// controlCall describes r as a control-plane call once Handler has authorized it: its
// op and whether it is recorded. Recorded: every mutating route but POST
// /metrics/events (the SDKs' telemetry), signed-URL minting (an endpoint with
// expires=), and the egress API's changes through the server proxy (port 18080:
// /policy, /credential-vault). Other server proxy requests are not (execd's are agent
// actions, source execd; refusals there are source ingress).
func (s *Server) controlCall(r *http.Request) (op string, ok bool) {
	_, pat := s.mux.Handler(r)
	if pat == proxyPattern || pat == proxyRestPattern {
		rest, found := strings.CutPrefix(r.URL.Path, "/sandboxes/"+sandboxIDOf(r.URL.Path)+"/proxy/"+strconv.Itoa(opensandbox.EgressAPIPort))
		if !found || !isMutating(r.Method) {
			return "", false
		}
		kind := "egress.policy"
		if strings.HasPrefix(rest, vaultPrefix) {
			kind = "vault"
		}
		switch r.Method {
		case http.MethodPost:
			return kind + ".create", true
		case http.MethodDelete:
			return kind + ".delete", true
		case http.MethodPut:
			return kind + ".put", true
		}
		return kind + ".patch", true
	}
	if pat == "GET /sandboxes/{id}/endpoints/{port}" {
		return controlOps[pat], r.URL.Query().Get("expires") != ""
	}
	if !isMutating(r.Method) || pat == "POST /metrics/events" {
		return "", false
	}
	if op, known := controlOps[pat]; known {
		return op, true
	}
	return "api.other", true
}

// statusWriter keeps the status of a response for its control record. Unwrap lets
// http.ResponseController reach the writer below (flush, hijack, full duplex).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// controlRecord builds the record of a control-plane call: r (after routing), the
// principal who (zero when none authenticated), the answer's status and Location
// header, and for a refusal the error Handler answered with. It never reads a body,
// so no key (shown once, in the answer of key.create and key.rotate) and no vault
// value reaches it.
func controlRecord(r *http.Request, op string, who principal.Principal, status int, location string, refusal error, start time.Time) audit.Record {
	rec := audit.Record{
		Time:      start.UTC(),
		SandboxID: sandboxIDOf(r.URL.Path),
		Source:    audit.SourceControl,
		Proto:     "http",
		Src:       r.RemoteAddr,
		Action:    "allow",
	}
	if r.TLS != nil {
		rec.Proto = "https"
	}
	outcome := "success"
	if status >= 400 {
		outcome = "failure"
	}
	path := "/v1" + r.URL.Path
	x := map[string]any{
		"op":          op,
		"method":      r.Method,
		"path":        path,
		"request_id":  r.Header.Get(opensandbox.HeaderRequestID),
		"status":      status,
		"outcome":     outcome,
		"duration_ms": float64(time.Since(start).Microseconds()) / 1000,
	}
	if r.Pattern != "" {
		if m, p, ok := strings.Cut(r.Pattern, " "); ok {
			x["route"] = m + " /v1" + p
		}
	}
	if who.ID != "" {
		x["principal"] = who.ID
		x["principal_name"] = who.Name
		x["role"] = string(who.Role)
	}
	// The target: the sandbox (path), a created sandbox or snapshot (Location), a key
	// or snapshot id (path), the library policy a sandbox was given (?name=).
	typ, target := "", ""
	switch {
	case strings.HasPrefix(op, "key."):
		typ, target = "key", strings.TrimPrefix(strings.TrimSuffix(r.URL.Path, "/rotate"), "/keys/")
		if op == "key.create" {
			target = strings.TrimPrefix(location, "/v1/keys/")
		}
	case op == "snapshot.create":
		typ, target = "snapshot", strings.TrimPrefix(location, "/v1/snapshots/")
	case op == "snapshot.delete":
		typ, target = "snapshot", strings.TrimPrefix(r.URL.Path, "/snapshots/")
	case op == "sandbox.create":
		if id, ok := strings.CutPrefix(location, "/v1/sandboxes/"); ok {
			rec.SandboxID = id
		}
	case op == "policy.put" && r.URL.Query().Get("name") != "":
		typ, target = "policy", r.URL.Query().Get("name")
		x["policy"] = target
	case op == "signed_url.mint":
		x["port"], _ = strconv.Atoi(r.PathValue("port"))
		x["expires"] = r.URL.Query().Get("expires")
	}
	if typ != "" && target != "" && target != "/" {
		x["target_type"], x["target"] = typ, target
	}
	rec.Reason = op + " " + outcome
	if refusal != nil {
		rec.Action = "deny"
		_, body, _ := httpError(refusal)
		rec.Reason = body.Message
		switch {
		case errors.Is(refusal, ErrUnauthorized):
			x["refusal"] = "unauthenticated"
		case errors.Is(refusal, ErrForbidden):
			x["refusal"] = "forbidden"
		default:
			x["refusal"] = "not_owner"
		}
	}
	rec.Extra = x
	return rec
}

// recordControl wraps the serving of an authorized request: when r is a control-plane
// call (controlCall), its answer's status is kept and its record appended once the
// handler returns. serve gets the writer and request to use.
func (s *Server) recordControl(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request)) {
	op, ok := "", false
	if s.cfg.Audit != nil {
		op, ok = s.controlCall(r)
	}
	if !ok {
		serve(w, r)
		return
	}
	start := time.Now()
	note := &controlNote{}
	note.who, _ = principal.FromContext(r.Context())
	r = r.WithContext(context.WithValue(r.Context(), controlNoteKey{}, note))
	sw := &statusWriter{ResponseWriter: w}
	serve(sw, r)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if (status == http.StatusUnauthorized || status == http.StatusForbidden) && strings.Contains(r.Pattern, "/proxy/") {
		return // a refusal of the server proxy: recorded there (source ingress)
	}
	rec := controlRecord(r, op, note.who, status, sw.Header().Get("Location"), nil, start)
	for k, v := range note.extra {
		rec.Extra[k] = v
	}
	s.cfg.Audit.Append(rec)
}

// recordRefusal appends the record of a request Handler refused (401 without a valid
// key, 403 for a role, 404 for a user reaching another principal's sandbox), whatever
// its method. Server proxy requests are not recorded here (the proxy authenticates
// them itself and records its refusals with source ingress).
func (s *Server) recordRefusal(r *http.Request, who principal.Principal, err error, start time.Time) {
	if s.cfg.Audit == nil {
		return
	}
	op, ok := s.controlCall(r)
	if !ok {
		op = "api.read"
		if isMutating(r.Method) {
			op = "api.other"
		}
	}
	_, pat := s.mux.Handler(r)
	r.Pattern = pat
	status, _, _ := httpError(err)
	s.cfg.Audit.Append(controlRecord(r, op, who, status, "", err, start))
}
