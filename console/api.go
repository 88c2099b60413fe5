package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"time"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// apiRoutes are the lifecycle routes the console passes through (path after
// /console/api): sandboxes and their endpoints, policies, audit and metadata, signed-URL
// revocation, the named-policy library and the API keys. Never the server proxy, the
// watch stream or metrics.
var apiRoutes = regexp.MustCompile(`^/v1/(sandboxes(/[A-Za-z0-9_.-]+(/(pause|resume|renew-expiration|metadata|policy(/proposal)?|audit|endpoints/[0-9]+|signed-urls/revoke))?)?|policies(/[A-Za-z0-9_.-]+)?|keys(/[A-Za-z0-9_.-]+(/rotate)?)?)$`)

// api passes /console/api/v1/… to the lifecycle API with the session's key (the API
// decides what its role allows): reads need a session, writes also the CSRF token and
// a same-origin request. Answers, including the {code,message} envelope of errors, are
// the API's own.
func (c *Console) api() http.Handler {
	pass := func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/console/api")
		if !apiRoutes.MatchString(path) {
			writeError(w, http.StatusNotFound, "NOT_FOUND", "the console does not pass "+r.Method+" "+path+" to the API")
			return
		}
		req := r.Clone(r.Context())
		req.URL.Path, req.URL.RawPath = path, ""
		req.RequestURI = ""
		req.Header = http.Header{}
		for _, k := range []string{"Content-Type", "Accept", opensandbox.HeaderRequestID} {
			if v := r.Header.Get(k); v != "" {
				req.Header.Set(k, v)
			}
		}
		if k := sessionOf(r).apiKey; k != "" {
			req.Header.Set(opensandbox.HeaderAPIKey, k)
		}
		c.cfg.API.ServeHTTP(w, req)
	}
	reads, writes := c.read(pass), c.write(pass)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			reads.ServeHTTP(w, r)
			return
		}
		writes.ServeHTTP(w, r)
	})
}

// apiError is a non-2xx answer of the lifecycle API: its status and error envelope.
type apiError struct {
	Status int
	opensandbox.ErrorBody
}

func (e *apiError) Error() string { return e.Message }

// apiGet calls the lifecycle API in-process with the key of ctx's session (read puts
// the session in the context; none: no key) and decodes a 200 answer into out; other
// answers are *apiError with the API's code and message.
func (c *Console) apiGet(ctx context.Context, path string, out any) error {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	req.RemoteAddr = "127.0.0.1:0"
	if s, _ := ctx.Value(ctxKey{}).(*session); s != nil && s.apiKey != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, s.apiKey)
	}
	rec := httptest.NewRecorder()
	c.cfg.API.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		e := &apiError{Status: rec.Code}
		if json.Unmarshal(rec.Body.Bytes(), e) != nil || e.Message == "" {
			e.Code, e.Message = "INTERNAL_ERROR", fmt.Sprintf("the API answered %d", rec.Code)
		}
		return e
	}
	return json.NewDecoder(bytes.NewReader(rec.Body.Bytes())).Decode(out)
}

// PolicyExtension is the create extension naming a policy of the library.
const PolicyExtension = "airlock.dev/policy"

// sandboxRow is one sandbox of GET /console/api/sandboxes.
type sandboxRow struct {
	lifecycle.Sandbox
	// PolicyName is the named policy the sandbox uses, "" when none or unknown.
	PolicyName string `json:"policyName"`
	// PolicyVersion is the stored policy's version; HasPolicy is false when the
	// operator's default applies.
	PolicyVersion uint64 `json:"policyVersion"`
	HasPolicy     bool   `json:"hasPolicy"`
	PolicyError   string `json:"policyError,omitempty"`
}

// policyInfo is the part of GET /v1/sandboxes/{id}/policy the console reads; Name is
// read when the policy library reports it.
type policyInfo struct {
	Version uint64          `json:"version"`
	Policy  json.RawMessage `json:"policy"`
	Name    string          `json:"name"`
	Named   string          `json:"policyName"`
}

// name is the policy's name: the library's answer, else the document's own name field.
func (p policyInfo) name() string {
	if p.Name != "" {
		return p.Name
	}
	if p.Named != "" {
		return p.Named
	}
	var doc struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(p.Policy, &doc)
	return doc.Name
}

// handleSandboxes answers GET /console/api/sandboxes: every sandbox (newest first, up to
// 1000) with its policy's name and version.
func (c *Console) handleSandboxes(w http.ResponseWriter, r *http.Request) {
	var list lifecycle.ListResponse
	if err := c.apiGet(r.Context(), "/v1/sandboxes?pageSize=1000", &list); err != nil {
		writeAPIError(w, err)
		return
	}
	rows := make([]sandboxRow, 0, len(list.Items))
	for _, sb := range list.Items {
		row := sandboxRow{Sandbox: sb, PolicyName: sb.Metadata[PolicyExtension]}
		var p policyInfo
		if err := c.apiGet(r.Context(), "/v1/sandboxes/"+sb.ID+"/policy", &p); err != nil {
			row.PolicyError = err.Error()
		} else {
			row.PolicyVersion = p.Version
			row.HasPolicy = len(p.Policy) > 0 && string(p.Policy) != "null"
			if n := p.name(); n != "" {
				row.PolicyName = n
			}
		}
		rows = append(rows, row)
	}
	opensandbox.WriteJSON(w, http.StatusOK, map[string]any{"items": rows, "total": list.Pagination.TotalItems,
		"now": c.cfg.Now().UTC()})
}

// writeError answers the lifecycle API's envelope, {"code","message"}
// (opensandbox.ErrorBody).
func writeError(w http.ResponseWriter, status int, code, msg string) {
	opensandbox.WriteError(w, status, opensandbox.ErrorBody{Code: code, Message: msg})
}

func writeAPIError(w http.ResponseWriter, err error) {
	if e, ok := err.(*apiError); ok {
		writeError(w, e.Status, e.Code, e.Message)
		return
	}
	writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "the console could not read the API's answer")
}

// parseTime reads an RFC 3339 time parameter; empty is the zero time.
func parseTime(v, name string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s must be an RFC 3339 time (2026-11-22T18:00:00Z)", name)
	}
	return t, nil
}
