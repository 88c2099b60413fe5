package execd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
)

// Sentinel errors. Handlers wrap them with a message written for the API user; toHTTP
// maps them to a status and an error code in one place.
var (
	// ErrInvalid is a malformed request: bad JSON, a missing field, an unusable value.
	ErrInvalid = errors.New("invalid request")
	// ErrNotFound is an unknown command, session, context or path.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized is a missing or wrong X-EXECD-ACCESS-TOKEN.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrUnsupportedLanguage is a code context for a language the image has no runtime for.
	ErrUnsupportedLanguage = errors.New("unsupported language")
	// ErrRange is a Range header that cannot be satisfied for the file's size.
	ErrRange = errors.New("range not satisfiable")
	// ErrBusy is a request that conflicts with work already running (a context that is
	// executing, a session that is running a command).
	ErrBusy = errors.New("busy")
	// ErrUnavailable is a feature this image cannot offer (no shell for commands).
	ErrUnavailable = errors.New("unavailable")
	// ErrAlreadyConnected is a WebSocket to a PTY session that another client holds
	// (execd-pty.md: 409 unless takeover=1).
	ErrAlreadyConnected = errors.New("already connected")
	// ErrLimit is a create past a limit of the sandbox (Config.MaxPTYSessions).
	ErrLimit = errors.New("limit exceeded")
	// ErrClosed is a request reaching a server, session or context that is shutting down.
	ErrClosed = errors.New("closed")
)

// userError carries a message written for the API user and the sentinel it maps to.
type userError struct {
	kind error
	msg  string
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.kind }

// errorf returns an error matching kind whose message is the formatted text alone.
func errorf(kind error, format string, args ...any) error {
	return &userError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// invalidf is errorf(ErrInvalid, ...).
func invalidf(format string, args ...any) error { return errorf(ErrInvalid, format, args...) }

// toHTTP maps an error to its HTTP status and error code. Errors that match no sentinel
// are runtime errors (500).
func toHTTP(err error) (int, string) {
	switch {
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest, "INVALID_REQUEST"
	case errors.Is(err, ErrUnsupportedLanguage):
		return http.StatusBadRequest, "UNSUPPORTED_LANGUAGE"
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, "UNAUTHORIZED"
	case errors.Is(err, ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound, "NOT_FOUND"
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden, "PERMISSION_DENIED"
	case errors.Is(err, fs.ErrExist):
		return http.StatusConflict, "ALREADY_EXISTS"
	case errors.Is(err, ErrAlreadyConnected):
		return http.StatusConflict, "ALREADY_CONNECTED"
	case errors.Is(err, ErrLimit):
		return http.StatusConflict, "PTY_LIMIT_EXCEEDED"
	case errors.Is(err, ErrBusy):
		return http.StatusConflict, "BUSY"
	case errors.Is(err, ErrRange):
		return http.StatusRequestedRangeNotSatisfiable, "RANGE_NOT_SATISFIABLE"
	case errors.Is(err, ErrUnavailable):
		return http.StatusNotImplemented, "NOT_AVAILABLE"
	case errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable, "SHUTTING_DOWN"
	case errors.Is(err, ErrHeld):
		return http.StatusServiceUnavailable, "STARTING"
	default:
		return http.StatusInternalServerError, "RUNTIME_ERROR"
	}
}

// writeError answers err as the JSON error envelope {code, message}
// (opensandbox.ErrorBody), its status and code from toHTTP.
func writeError(w http.ResponseWriter, err error) {
	status, code := toHTTP(err)
	opensandbox.WriteError(w, status, opensandbox.ErrorBody{Code: code, Message: err.Error()})
}

// writeJSON answers v as JSON with status (opensandbox.WriteJSON).
func writeJSON(w http.ResponseWriter, status int, v any) { opensandbox.WriteJSON(w, status, v) }

// writeEmpty answers an empty success: 200 with Content-Length: 0 (NOTES.md: the SDK
// parses any other 2xx body as JSON).
func writeEmpty(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// decodeJSON reads a JSON request body into v. An empty body is an error unless
// allowEmpty is set.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20))
	if err := dec.Decode(v); err != nil {
		if allowEmpty && errors.Is(err, io.EOF) {
			return nil
		}
		return invalidf("error parsing request body: %v", err)
	}
	return nil
}
