package gateway

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/airlockdev/airlock/opensandbox"
)

// Sentinel errors of a request decision. Each maps to one HTTP status and code in
// statusOf, the only place that does so; the message a client sees is the decision's
// reason, written for users, never an internal error.
var (
	ErrBadRoute         = errors.New("bad route")
	ErrNotFound         = errors.New("sandbox not found")
	ErrGone             = errors.New("sandbox gone")
	ErrNotRunning       = errors.New("sandbox not running")
	ErrPaused           = errors.New("sandbox paused")
	ErrNotReady         = errors.New("route table not loaded")
	ErrUnauthorized     = errors.New("unauthorized")
	ErrForbidden        = errors.New("forbidden")
	ErrOverCapacity     = errors.New("too many connections")
	ErrUpstream         = errors.New("upstream unavailable")
	errNotProvisioned   = errors.New("gateway: airlock app not provisioned")
	errNoRouteInRequest = errors.New("gateway: no airlock route decision in the request (put the airlock handler before reverse_proxy)")
)

// result labels, one per outcome, used in metrics and audit records.
type result uint8

const (
	resProxied result = iota
	resBadRoute
	resNotFound
	resGone
	resNotRunning
	resUnauthorized
	resForbidden
	resOverCapacity
	resUpstreamError
	resNotReady
	resPaused
	numResults
)

var resultNames = [numResults]string{"proxied", "bad_route", "not_found", "gone", "not_running",
	"unauthorized", "forbidden", "over_capacity", "upstream_error", "not_ready", "paused"}

func (r result) String() string { return resultNames[r] }

// errorStatus is how one sentinel error reaches the client.
type errorStatus struct {
	status int
	code   string
	res    result
}

// statusOf maps a decision error to its HTTP status, JSON code and result label.
func statusOf(err error) errorStatus {
	switch {
	case errors.Is(err, ErrBadRoute):
		return errorStatus{http.StatusBadRequest, "BAD_ROUTE", resBadRoute}
	case errors.Is(err, ErrNotFound):
		return errorStatus{http.StatusNotFound, "SANDBOX_NOT_FOUND", resNotFound}
	case errors.Is(err, ErrGone):
		return errorStatus{http.StatusGone, "SANDBOX_GONE", resGone}
	case errors.Is(err, ErrNotReady):
		return errorStatus{http.StatusServiceUnavailable, "GATEWAY_NOT_READY", resNotReady}
	case errors.Is(err, ErrPaused):
		return errorStatus{http.StatusConflict, "SANDBOX_PAUSED", resPaused}
	case errors.Is(err, ErrNotRunning):
		return errorStatus{http.StatusServiceUnavailable, "SANDBOX_NOT_RUNNING", resNotRunning}
	case errors.Is(err, ErrUnauthorized):
		return errorStatus{http.StatusUnauthorized, "UNAUTHORIZED", resUnauthorized}
	case errors.Is(err, ErrForbidden):
		return errorStatus{http.StatusForbidden, "FORBIDDEN", resForbidden}
	case errors.Is(err, ErrOverCapacity):
		return errorStatus{http.StatusTooManyRequests, "TOO_MANY_CONNECTIONS", resOverCapacity}
	default:
		return errorStatus{http.StatusBadGateway, "UPSTREAM_UNAVAILABLE", resUpstreamError}
	}
}

// writeError writes the JSON error envelope (opensandbox.ErrorBody) for st with message
// msg and the request id. retryAfter > 0 sets Retry-After (seconds).
func writeError(w http.ResponseWriter, st errorStatus, msg, requestID string, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	opensandbox.WriteError(w, st.status, opensandbox.ErrorBody{Code: st.code, Message: msg, RequestID: requestID})
}
