package egressd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// checkRequest decides req, a request to a host with HTTP rules (policies.HTTPHost),
// on a relayed plain-HTTP connection or an intercepted TLS one. It returns the audit
// record (base completed: source l7, the deciding rule, extra.method and extra.path,
// never the query or a header value) and the decision. An allowed request's method is
// upper-cased, so the upstream acts on the method that was checked.
//
// When a rule of the host reads the body (jsonrpc, mcpTools), up to h.BodyLimit()+1
// bytes of it are read first and put back in front of the rest, so the upstream gets
// the whole body; continue100, when not nil, is called before that read for a request
// that expects "100 Continue" (the relay answers it itself; net/http's server does so
// on its own).
func checkRequest(h *policies.HTTPHost, req *http.Request, base audit.Record, continue100 func()) (audit.Record, policies.Decision) {
	q := policies.HTTPRequest{Method: req.Method, EscapedPath: req.URL.EscapedPath(),
		RawQuery: req.URL.RawQuery, Header: req.Header}
	if limit := h.BodyLimit(); limit > 0 && req.Body != nil && req.Body != http.NoBody {
		if continue100 != nil && strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			continue100()
			req.Header.Del("Expect")
		}
		buf, err := io.ReadAll(io.LimitReader(req.Body, int64(limit)+1))
		q.Body, q.BodyTooLarge = buf, len(buf) > limit
		if err != nil {
			q.Body, q.BodyTooLarge = nil, true // unreadable: cannot be checked
		}
		req.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
	}
	dec := h.Decide(q)
	rec := base
	rec.Time = time.Now()
	rec.Action, rec.WouldDeny, rec.Rule, rec.Reason = string(dec.Action), dec.WouldDeny, dec.Rule, dec.Reason
	rec.Mode, rec.PolicyVersion = string(dec.Mode), dec.Version
	rec.Extra = map[string]any{"method": req.Method, "path": req.URL.Path, "http_rule": true}
	if dec.Allowed() {
		req.Method = strings.ToUpper(req.Method)
	}
	return rec, dec
}

// httpDenied is the JSON body of a request refused by an HTTP rule: the error envelope
// with the rule, so that the agent in the sandbox can read why.
type httpDenied struct {
	opensandbox.ErrorBody
	// Rule names the deciding rule ("egress[1].http.rules[0]").
	Rule string `json:"rule"`
}

// deniedResponse is the 403 answer to req, refused by dec on host: JSON {code:
// EGRESS_DENIED, message, rule}; the connection closes after it.
func deniedResponse(req *http.Request, host string, dec policies.Decision) *http.Response {
	body, _ := json.Marshal(httpDenied{ErrorBody: opensandbox.ErrorBody{Code: "EGRESS_DENIED",
		Message: fmt.Sprintf("%s %s on %s is refused by the egress policy: %s (rule %s)", req.Method, req.URL.Path, host, dec.Reason, dec.Rule)},
		Rule: dec.Rule})
	body = append(body, '\n')
	return &http.Response{
		StatusCode: http.StatusForbidden, Status: "403 Forbidden", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"},
			"Content-Length": {strconv.Itoa(len(body))}},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Close: true, Request: req,
	}
}

// streamsChecked keeps an intercepted connection to a host with HTTP rules made of
// requests the rules see: a CONNECT (goproxy would open a tunnel to the host, inside
// which requests pass unchecked) is refused with 403 and audited; an Upgrade other than
// websocket (h2c would carry HTTP/2 streams) is dropped. It reports whether r goes on.
func (cp *credentialProxy) streamsChecked(w http.ResponseWriter, r *http.Request, t credTarget) bool {
	if up := r.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		r.Header.Del("Upgrade")
		r.Header.Del("Http2-Settings")
	}
	if r.Method != http.MethodConnect {
		return true
	}
	dec := policies.Decision{Action: policies.Deny, Rule: "l7", Reason: "CONNECT inside an intercepted connection: requests in a tunnel could not be checked"}
	if cp.d.cfg.Audit != nil {
		cp.d.cfg.Audit.Append(audit.Record{Time: time.Now(), SandboxID: t.sandbox, Source: audit.SourceL7, Src: t.src,
			DstHost: t.host, DstIP: t.dst.Addr().String(), DstPort: int(t.dst.Port()), Proto: t.scheme,
			Action: string(dec.Action), Rule: dec.Rule, Reason: dec.Reason, Extra: map[string]any{"method": r.Method},
			Mode: string(t.http.Mode()), PolicyVersion: t.http.Version()})
	}
	resp := deniedResponse(r, t.host, dec)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Connection", "close")
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
	return false
}
