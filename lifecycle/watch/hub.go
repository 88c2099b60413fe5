package watch

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// DefaultHistory is how many events a Hub keeps for resuming clients.
const DefaultHistory = 4096

// BookmarkInterval is how often a stream carries a BOOKMARK heartbeat.
const BookmarkInterval = 10 * time.Second

// Hub holds the current set of sandboxes and a bounded history of changes, and serves the
// watch stream to any number of clients. Publish never blocks on a slow client: a client
// that falls more than the history behind is disconnected and resumes with a snapshot.
type Hub struct {
	epoch   string
	history int
	log     *slog.Logger

	mu      sync.Mutex
	rv      uint64
	current map[string]Sandbox
	events  []Event // ring of the last `history` events, oldest first
	waiters map[chan struct{}]struct{}
}

// NewHub returns an empty Hub with a fresh random epoch. history ≤ 0 means
// DefaultHistory; log may be nil.
func NewHub(history int, log *slog.Logger) *Hub {
	if history <= 0 {
		history = DefaultHistory
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Hub{
		epoch:   hex.EncodeToString(b[:]),
		history: history,
		log:     log,
		current: make(map[string]Sandbox),
		waiters: make(map[chan struct{}]struct{}),
	}
}

// Epoch returns the hub's epoch.
func (h *Hub) Epoch() string { return h.epoch }

// ResourceVersion returns the version of the last change.
func (h *Hub) ResourceVersion() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rv
}

// Put records s as added or modified. A Put that changes nothing publishes nothing.
func (h *Hub) Put(s Sandbox) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, existed := h.current[s.ID]
	if existed && sameSandbox(old, s) {
		return
	}
	h.current[s.ID] = s
	typ := Added
	if existed {
		typ = Modified
	}
	h.appendLocked(typ, s)
}

// Delete records the removal of the sandbox id; unknown ids publish nothing.
func (h *Hub) Delete(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, ok := h.current[id]
	if !ok {
		return
	}
	delete(h.current, id)
	h.appendLocked(Deleted, old)
}

// Get returns the current view of one sandbox.
func (h *Hub) Get(id string) (Sandbox, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.current[id]
	return s, ok
}

func (h *Hub) appendLocked(typ EventType, s Sandbox) {
	h.rv++
	ev := Event{Type: typ, ResourceVersion: h.rv, Time: time.Now().UTC(), Sandbox: &s}
	if len(h.events) == h.history {
		copy(h.events, h.events[1:])
		h.events = h.events[:len(h.events)-1]
	}
	h.events = append(h.events, ev)
	for w := range h.waiters {
		close(w)
		delete(h.waiters, w)
	}
}

// since returns the events after rv, or ok=false when rv is older than the history.
func (h *Hub) sinceLocked(rv uint64) ([]Event, bool) {
	if rv == h.rv {
		return nil, true
	}
	if rv > h.rv || len(h.events) == 0 || h.events[0].ResourceVersion > rv+1 {
		return nil, false
	}
	i := int(rv + 1 - h.events[0].ResourceVersion)
	return append([]Event(nil), h.events[i:]...), true
}

// snapshotLocked returns RESET, one ADDED per sandbox, in no particular order.
func (h *Hub) snapshotLocked() []Event {
	evs := make([]Event, 0, len(h.current)+1)
	evs = append(evs, Event{Type: Reset, ResourceVersion: h.rv, Epoch: h.epoch})
	for _, s := range h.current {
		evs = append(evs, Event{Type: Added, ResourceVersion: h.rv, Sandbox: &s})
	}
	return evs
}

// ServeHTTP streams the watch to one client until it disconnects (see the package
// documentation for the protocol). Authentication is the caller's job: wrap the Hub.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	fromRV, _ := strconv.ParseUint(r.URL.Query().Get("resourceVersion"), 10, 64)
	epoch := r.URL.Query().Get("epoch")

	h.mu.Lock()
	var first []Event
	var ok bool
	if epoch == h.epoch && fromRV > 0 {
		first, ok = h.sinceLocked(fromRV)
	}
	if !ok {
		first = h.snapshotLocked()
	}
	rv := h.rv
	first = append(first, Event{Type: Synced, ResourceVersion: rv, Epoch: h.epoch})
	h.mu.Unlock()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	write := func(evs []Event) bool {
		for _, ev := range evs {
			if err := enc.Encode(ev); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	if !write(first) {
		return
	}

	tick := time.NewTicker(BookmarkInterval)
	defer tick.Stop()
	for {
		h.mu.Lock()
		next, ok := h.sinceLocked(rv)
		if !ok {
			// Fell behind the history: end the stream; the client resumes with a snapshot.
			h.mu.Unlock()
			h.log.Warn("watch client fell behind, closing stream", "remote", r.RemoteAddr)
			return
		}
		var wake chan struct{}
		if len(next) == 0 {
			wake = make(chan struct{})
			h.waiters[wake] = struct{}{}
		} else {
			rv = next[len(next)-1].ResourceVersion
		}
		h.mu.Unlock()

		if len(next) > 0 {
			if !write(next) {
				return
			}
			continue
		}
		select {
		case <-r.Context().Done():
			h.dropWaiter(wake)
			return
		case <-wake:
		case <-tick.C:
			h.dropWaiter(wake)
			if !write([]Event{{Type: Bookmark, ResourceVersion: rv, Time: time.Now().UTC()}}) {
				return
			}
		}
	}
}

func (h *Hub) dropWaiter(w chan struct{}) {
	h.mu.Lock()
	delete(h.waiters, w)
	h.mu.Unlock()
}

// sameSandbox compares two views through their JSON form: Sandbox holds maps and raw
// JSON, and a publish is rare next to a lookup, so clarity wins over speed here.
func sameSandbox(a, b Sandbox) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}
