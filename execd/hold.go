package execd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// HoldWait is how long a request that reaches a held sandbox waits for the release
// before it is answered 503 STARTING: clients that probe only GET /ping (the
// OpenSandbox SDKs) then simply see their first command start after enforcement.
const HoldWait = 30 * time.Second

// maxReleaseBody bounds a release body (env values included).
const maxReleaseBody = 1 << 20

// ErrHeld is a request that reaches a sandbox still held: its egress enforcement has
// not been confirmed, so nothing of the user may run yet (503 STARTING).
var ErrHeld = errors.New("held")

// Hold keeps a new sandbox's user processes from starting until Airlock has confirmed
// that its egress policy is enforced: PID 1 mode waits for Released before it starts
// the entrypoint, and the Server holds every request but GET /ping and POST
// opensandbox.ReleasePath until then (HoldWait at most, then 503 STARTING). The zero value is held; Release is idempotent.
type Hold struct {
	once sync.Once
	ch   chan struct{}
	mu   sync.Mutex
	rel  opensandbox.Release // what the release brought; read after Released is closed
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

// ReleaseWith applies rel (its Env to this process's environment) and releases; it
// reports false, changing nothing, when the hold was already released.
func (h *Hold) ReleaseWith(rel opensandbox.Release) bool {
	h.init()
	applied := false
	h.once.Do(func() {
		for k, v := range rel.Env {
			os.Setenv(k, v)
		}
		h.rel = rel
		applied = true
		close(h.ch)
	})
	return applied
}

// Entrypoint is the entrypoint the release brought (nil: keep the configured one).
// Call it after Released is closed.
func (h *Hold) Entrypoint() []string {
	<-h.Released()
	return h.rel.Entrypoint
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
// except for GET /ping and the release itself (POST releases, GET reports
// opensandbox.ReleaseState).
func holdMiddleware(h *Hold, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == opensandbox.ReleasePath && r.Method == http.MethodGet {
			writeJSON(w, http.StatusOK, opensandbox.ReleaseState{Held: h.Held()})
			return
		}
		if r.URL.Path == opensandbox.ReleasePath && r.Method == http.MethodPost {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxReleaseBody+1))
			if err != nil || len(body) > maxReleaseBody {
				writeError(w, errorf(ErrInvalid, "release body unreadable or over %d bytes", maxReleaseBody))
				return
			}
			if len(bytes.TrimSpace(body)) == 0 {
				h.Release()
				w.WriteHeader(http.StatusNoContent)
				return
			}
			var rel opensandbox.Release
			if err := json.Unmarshal(body, &rel); err != nil {
				writeError(w, errorf(ErrInvalid, "release body: %v", err))
				return
			}
			for k, v := range rel.Env {
				if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
					writeError(w, errorf(ErrInvalid, "release body: env name %q or its value is invalid", k))
					return
				}
			}
			if len(rel.Entrypoint) > 0 && rel.Entrypoint[0] == "" {
				writeError(w, errorf(ErrInvalid, "release body: entrypoint[0] is empty"))
				return
			}
			if !h.ReleaseWith(rel) {
				writeError(w, errorf(fs.ErrExist, "already released: the settings of this release cannot apply to what already runs"))
				return
			}
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
