package execd

import (
	"errors"
	"net/http"
	"sync"
	"time"
)

// HoldWait is how long a request that reaches a held sandbox waits for the release
// before it is answered 503 STARTING: clients that probe only GET /ping (the
// OpenSandbox SDKs) then simply see their first command start after enforcement.
const HoldWait = 30 * time.Second

// ReleasePath is where Airlock's lifecycle server releases a held sandbox (not part
// of the OpenSandbox execd API): POST, no body, 204 whether or not it was held.
const ReleasePath = "/_airlock/release"

// ErrHeld is a request that reaches a sandbox still held: its egress enforcement has
// not been confirmed, so nothing of the user may run yet (503 STARTING).
var ErrHeld = errors.New("held")

// Hold keeps a new sandbox's user processes from starting until Airlock has confirmed
// that its egress policy is enforced: PID 1 mode waits for Released before it starts
// the entrypoint, and the Server holds every request but GET /ping and POST
// ReleasePath until then (HoldWait at most, then 503 STARTING). The zero value is held; Release is idempotent.
type Hold struct {
	once sync.Once
	ch   chan struct{}
	mu   sync.Mutex
}

func (h *Hold) init() {
	h.mu.Lock()
	if h.ch == nil {
		h.ch = make(chan struct{})
	}
	h.mu.Unlock()
}

// Release lets the held processes start.
func (h *Hold) Release() {
	h.init()
	h.once.Do(func() { close(h.ch) })
}

// Released is closed once Release was called.
func (h *Hold) Released() <-chan struct{} {
	h.init()
	return h.ch
}

// Held reports whether Release has not been called yet.
func (h *Hold) Held() bool {
	select {
	case <-h.Released():
		return false
	default:
		return true
	}
}

// holdMiddleware makes requests wait while hold is held (HoldWait, then ErrHeld),
// except for GET /ping and the release itself.
func holdMiddleware(h *Hold, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == ReleasePath && r.Method == http.MethodPost {
			h.Release()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if h.Held() && !(r.Method == http.MethodGet && r.URL.Path == "/ping") {
			t := time.NewTimer(HoldWait)
			defer t.Stop()
			select {
			case <-h.Released():
			case <-r.Context().Done():
				return
			case <-t.C:
				writeError(w, errorf(ErrHeld, "the sandbox is starting: its egress policy was not confirmed enforced within %s", HoldWait))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
