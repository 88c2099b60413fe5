package opensandbox

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ErrorBody is the JSON envelope of every non-2xx answer of every Airlock server
// (sandbox-lifecycle.yml, ErrorResponse: {code, message}), with the request id when
// the server assigns one.
type ErrorBody struct {
	// Code is a stable, machine-readable upper-case code, e.g. "SANDBOX_NOT_FOUND".
	Code string `json:"code"`
	// Message is written for users; it never carries an internal error.
	Message string `json:"message"`
	// RequestID names the request in the server's log ("" when none).
	RequestID string `json:"requestId,omitempty"`
}

// encodingFailed answers when a body cannot be encoded (it never happens for
// ErrorBody; it keeps WriteJSON total).
var encodingFailed = []byte(`{"code":"INTERNAL_ERROR","message":"encoding the answer failed"}` + "\n")

// WriteError answers status with body as JSON, marked not cacheable. Headers the caller
// set before (Retry-After, for one) are kept.
func WriteError(w http.ResponseWriter, status int, body ErrorBody) {
	w.Header().Set("Cache-Control", "no-store")
	WriteJSON(w, status, body)
}

// WriteJSON answers status with v encoded as JSON and a trailing newline, with
// Content-Type and Content-Length set. A v that cannot be encoded becomes a 500
// INTERNAL_ERROR envelope.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, encodingFailed
	} else {
		body = append(body, '\n')
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
