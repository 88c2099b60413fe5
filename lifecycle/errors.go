package lifecycle

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
)

// Error is a failure the API reports to its client: an HTTP status, a stable
// machine-readable code and a message written for users. The package's sentinel errors
// are *Error values; wrap them with fmt.Errorf("%w: detail", ErrX) to add the detail.
type Error struct {
	Status int
	Code   string
	Text   string
}

func (e *Error) Error() string { return e.Text }

// Sentinel errors, mapped to HTTP status and code in exactly one place (httpError).
var (
	// ErrInvalidJSON: the body is not the JSON the route expects (400 INVALID_JSON).
	ErrInvalidJSON = &Error{http.StatusBadRequest, "INVALID_JSON", "malformed JSON body"}
	// ErrInvalidRequest: a field fails validation (400 INVALID_REQUEST).
	ErrInvalidRequest = &Error{http.StatusBadRequest, "INVALID_REQUEST", "invalid request"}
	// ErrInvalidResources: a resource limit is not a valid quantity or out of bounds
	// (400 INVALID_RESOURCE_LIMITS).
	ErrInvalidResources = &Error{http.StatusBadRequest, "INVALID_RESOURCE_LIMITS", "invalid resourceLimits"}
	// ErrInvalidVolume: a volume is malformed or its host path is not allowed
	// (400 INVALID_VOLUME).
	ErrInvalidVolume = &Error{http.StatusBadRequest, "INVALID_VOLUME", "invalid volume"}
	// ErrImageUnavailable: the image is not present and cannot be pulled
	// (400 IMAGE_UNAVAILABLE).
	ErrImageUnavailable = &Error{http.StatusBadRequest, "IMAGE_UNAVAILABLE", "image unavailable"}
	// ErrUnauthorized: missing or wrong API key (401 UNAUTHORIZED).
	ErrUnauthorized = &Error{http.StatusUnauthorized, "UNAUTHORIZED", "missing or invalid OPEN-SANDBOX-API-KEY"}
	// ErrAccessDenied: a server proxy request without a credential that admits it
	// (the sandbox's access token or the API key) (401 UNAUTHORIZED).
	ErrAccessDenied = &Error{http.StatusUnauthorized, "UNAUTHORIZED", "no valid credential for this sandbox port"}
	// ErrForbidden: the request is refused whoever sends it, for example a service
	// worker script fetch through the server proxy's path form, or refused to the
	// caller's role (a route its principal.Role does not allow) (403 FORBIDDEN).
	ErrForbidden = &Error{http.StatusForbidden, "FORBIDDEN", "forbidden"}
	// ErrNotFound: no sandbox with that id (404 SANDBOX_NOT_FOUND).
	ErrNotFound = &Error{http.StatusNotFound, "SANDBOX_NOT_FOUND", "sandbox not found"}
	// ErrSnapshotNotFound: no snapshot with that id (404 SNAPSHOT_NOT_FOUND).
	ErrSnapshotNotFound = &Error{http.StatusNotFound, "SNAPSHOT_NOT_FOUND", "snapshot not found"}
	// ErrSnapshotLimit: a snapshot would pass the operator's limits on snapshots per
	// sandbox or in all (count or bytes; Config.Snapshots) (409 SNAPSHOT_LIMIT_EXCEEDED).
	ErrSnapshotLimit = &Error{http.StatusConflict, "SNAPSHOT_LIMIT_EXCEEDED", "snapshot limit exceeded"}
	// ErrKeyNotFound: no API key (principal) with that id (404 KEY_NOT_FOUND).
	ErrKeyNotFound = &Error{http.StatusNotFound, "KEY_NOT_FOUND", "api key not found"}
	// ErrNoRoute: no such route (404 NOT_FOUND).
	ErrNoRoute = &Error{http.StatusNotFound, "NOT_FOUND", "no such route"}
	// ErrInvalidState: the operation does not apply in the sandbox's state
	// (409 INVALID_STATE).
	ErrInvalidState = &Error{http.StatusConflict, "INVALID_STATE", "operation not allowed in the sandbox's state"}
	// ErrNotImplemented: a route of the specification Airlock does not serve yet
	// (501 NOT_IMPLEMENTED).
	ErrNotImplemented = &Error{http.StatusNotImplemented, "NOT_IMPLEMENTED", "not implemented"}
	// ErrUnavailable: the sandbox cannot take traffic now, for example while paused
	// (503 SANDBOX_UNAVAILABLE).
	ErrUnavailable = &Error{http.StatusServiceUnavailable, "SANDBOX_UNAVAILABLE", "sandbox unavailable"}
	// ErrUpstream: the sandbox did not answer the proxied request (502 BAD_GATEWAY).
	ErrUpstream = &Error{http.StatusBadGateway, "BAD_GATEWAY", "sandbox did not answer"}
	// ErrPrecondition: what the operation needs was not set up, for example a Credential
	// Vault for a sandbox created without credentialProxy (412 PRECONDITION_FAILED).
	ErrPrecondition = &Error{http.StatusPreconditionFailed, "PRECONDITION_FAILED", "precondition failed"}
	// ErrPolicyExists: a policy of that name is already in the library and the request
	// did not ask to replace it (409 POLICY_EXISTS).
	ErrPolicyExists = &Error{http.StatusConflict, "POLICY_EXISTS", "a policy of that name is already in the library"}
)

var sentinels = []*Error{
	ErrInvalidJSON, ErrInvalidRequest, ErrInvalidResources, ErrInvalidVolume,
	ErrImageUnavailable, ErrUnauthorized, ErrAccessDenied, ErrForbidden, ErrNotFound, ErrSnapshotNotFound, ErrSnapshotLimit, ErrKeyNotFound, ErrNoRoute, ErrInvalidState,
	ErrNotImplemented, ErrUnavailable, ErrUpstream, ErrPrecondition, ErrPolicyExists,
}

// httpError maps err to its status and envelope. Errors that wrap no sentinel are
// internal: their text never reaches the client (internal reports true so the caller
// logs it).
func httpError(err error) (status int, body opensandbox.ErrorBody, internal bool) {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s.Status, opensandbox.ErrorBody{Code: s.Code, Message: err.Error()}, false
		}
	}
	return http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL_ERROR", Message: "internal error; see the server log for this request id"}, true
}

// fail answers err as the JSON error envelope (opensandbox.WriteError) with the status
// and code httpError maps it to and the request's id (Handler assigns one to every
// request). An internal error is logged here, once, and its text never reaches the
// client.
func fail(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	status, body, internal := httpError(err)
	body.RequestID = r.Header.Get(opensandbox.HeaderRequestID)
	if internal {
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "request_id", body.RequestID, "err", err)
	}
	opensandbox.WriteError(w, status, body)
}
