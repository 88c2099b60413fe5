// Package routetable is the gateway's in-memory copy of the sandboxes lifecycle knows: id
// → address, state, access settings, expiry, plus per-sandbox counters the gateway keeps
// (in-flight connections, last renew intent). It is fed by the lifecycle watch stream (it
// implements watch.Handler) and read on every request.
//
// Lookup never performs I/O and takes no lock: entries live in a sync.Map and each holds
// its sandbox facts behind an atomic pointer, so 10,000 routes cost one hash lookup. A
// deleted sandbox leaves a tombstone for a while so the gateway can answer 410 Gone rather
// than 404. When a sandbox is deleted its entry's context is cancelled, which ends the
// requests and streams still proxied to it.
package routetable

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// Config configures a Table.
type Config struct {
	// TombstoneTTL is how long a deleted id answers "gone"; default 1 h.
	TombstoneTTL time.Duration
	// MaxTombstones bounds the memory of deleted ids; default 100,000.
	MaxTombstones int
	// OnChange, when set, is called after every change with the new size (from the
	// watch goroutine; keep it fast).
	OnChange func(size int)
	// OnDelete, when set, is called with a deleted sandbox's last facts right after its
	// entry's context is cancelled (from the watch goroutine; keep it fast). Do not
	// modify the value.
	OnDelete func(s *watch.Sandbox)
}

// Entry is one sandbox in the table. Its facts change when lifecycle sends a new version;
// its counters survive such changes.
type Entry struct {
	f         atomic.Pointer[facts]
	conns     atomic.Int64
	lastRenew atomic.Int64 // unix nanoseconds of the last renew intent
	ctx       context.Context
	cancel    context.CancelFunc
}

// facts is one version of a sandbox as the table serves it.
type facts struct {
	sb   watch.Sandbox
	host string // Address (or Address6) as a dial host, "" when the sandbox has none
	// token is Access.TokenSHA256 decoded once per version; nil when there is none (or
	// it is malformed: then no token matches).
	token *accesstoken.Digest
}

func newFacts(s watch.Sandbox) *facts {
	f := &facts{sb: s}
	if d, err := accesstoken.ParseDigest(s.Access.TokenSHA256); err == nil {
		f.token = &d
	}
	switch {
	case s.Address.IsValid():
		f.host = s.Address.String()
	case s.Address6.IsValid():
		f.host = "[" + s.Address6.String() + "]"
	}
	return f
}

// Sandbox returns the entry's current facts. The value is shared: do not modify it.
func (e *Entry) Sandbox() *watch.Sandbox { return &e.f.Load().sb }

// View returns the entry's current facts and, from the same version, the decoded SHA-256
// of the sandbox's access token (nil when lifecycle published none). Both are shared: do
// not modify them. It allocates nothing.
func (e *Entry) View() (*watch.Sandbox, *accesstoken.Digest) {
	f := e.f.Load()
	return &f.sb, f.token
}

// Dial returns "host:port" for port of the sandbox's address (IPv4 preferred), or ""
// when the sandbox has no address. It allocates only the result.
func (e *Entry) Dial(port int) string {
	f := e.f.Load()
	if f.host == "" {
		return ""
	}
	return f.host + ":" + strconv.Itoa(port)
}

// Context is cancelled when the sandbox is deleted from the table.
func (e *Entry) Context() context.Context { return e.ctx }

// Acquire counts one more in-flight connection unless limit (> 0) is reached; it reports
// whether the connection may proceed. Every successful Acquire needs one Release.
func (e *Entry) Acquire(limit int) bool {
	n := e.conns.Add(1)
	if limit > 0 && n > int64(limit) {
		e.conns.Add(-1)
		return false
	}
	return true
}

// Release ends a connection counted by Acquire.
func (e *Entry) Release() { e.conns.Add(-1) }

// Conns returns the number of in-flight connections.
func (e *Entry) Conns() int64 { return e.conns.Load() }

// ClaimRenew reports whether a renew intent may be sent at now: true at most once per
// interval per entry, for the caller that wins.
func (e *Entry) ClaimRenew(now time.Time, interval time.Duration) bool {
	last := e.lastRenew.Load()
	if last != 0 && now.UnixNano()-last < int64(interval) {
		return false
	}
	return e.lastRenew.CompareAndSwap(last, now.UnixNano())
}

// Table maps sandbox ids to entries. Lookups are lock-free; changes come from one writer
// at a time (the watch goroutine) and are serialised by a mutex.
type Table struct {
	cfg     Config
	entries sync.Map // string → *Entry
	size    atomic.Int64
	rv      atomic.Uint64

	mu    sync.Mutex // writers; guards tombs and order
	tombs map[string]time.Time
	order []tomb // insertion order from head on, for expiry and the size bound
	head  int
}

type tomb struct {
	id string
	at time.Time
}

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.TombstoneTTL <= 0 {
		cfg.TombstoneTTL = time.Hour
	}
	if cfg.MaxTombstones <= 0 {
		cfg.MaxTombstones = 100_000
	}
	return &Table{cfg: cfg, tombs: make(map[string]time.Time)}
}

// Lookup returns the entry of id. It never performs I/O and never blocks.
func (t *Table) Lookup(id string) (*Entry, bool) {
	v, ok := t.entries.Load(id)
	if !ok {
		return nil, false
	}
	return v.(*Entry), true
}

// Gone reports whether id was deleted within the tombstone TTL before now.
func (t *Table) Gone(id string, now time.Time) bool {
	t.mu.Lock()
	at, ok := t.tombs[id]
	t.mu.Unlock()
	return ok && now.Sub(at) < t.cfg.TombstoneTTL
}

// Len returns the number of sandboxes in the table.
func (t *Table) Len() int { return int(t.size.Load()) }

// ResourceVersion returns the watch resource version of the last applied change.
func (t *Table) ResourceVersion() uint64 { return t.rv.Load() }

// Range calls f for each entry until f returns false (no particular order).
func (t *Table) Range(f func(id string, e *Entry) bool) {
	t.entries.Range(func(k, v any) bool { return f(k.(string), v.(*Entry)) })
}

// Upsert adds or replaces the facts of one sandbox (watch.Handler).
func (t *Table) Upsert(s watch.Sandbox, rv uint64) {
	t.mu.Lock()
	t.upsertLocked(s)
	t.rv.Store(rv)
	t.mu.Unlock()
	t.changed()
}

// Delete removes one sandbox, cancels its entry's context and leaves a tombstone
// (watch.Handler).
func (t *Table) Delete(id string, rv uint64) {
	t.mu.Lock()
	t.deleteLocked(id, time.Now())
	t.rv.Store(rv)
	t.mu.Unlock()
	t.changed()
}

// Replace installs the complete set after a watch snapshot: entries not in all are
// deleted as by Delete (watch.Handler).
func (t *Table) Replace(all []watch.Sandbox, rv uint64) {
	keep := make(map[string]struct{}, len(all))
	for _, s := range all {
		if s.Pool == "" {
			keep[s.ID] = struct{}{}
		}
	}
	now := time.Now()
	t.mu.Lock()
	for _, s := range all {
		t.upsertLocked(s)
	}
	t.entries.Range(func(k, _ any) bool {
		if _, ok := keep[k.(string)]; !ok {
			t.deleteLocked(k.(string), now)
		}
		return true
	})
	t.rv.Store(rv)
	t.mu.Unlock()
	t.changed()
}

func (t *Table) upsertLocked(s watch.Sandbox) {
	if s.Pool != "" { // an unclaimed warm pool member has no routes
		return
	}
	f := newFacts(s) // the table owns its copy
	delete(t.tombs, s.ID)
	if v, ok := t.entries.Load(s.ID); ok {
		v.(*Entry).f.Store(f)
		return
	}
	e := &Entry{}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.f.Store(f)
	t.entries.Store(s.ID, e)
	t.size.Add(1)
}

func (t *Table) deleteLocked(id string, now time.Time) {
	v, ok := t.entries.LoadAndDelete(id)
	if !ok {
		return
	}
	t.size.Add(-1)
	v.(*Entry).cancel()
	if t.cfg.OnDelete != nil {
		t.cfg.OnDelete(v.(*Entry).Sandbox())
	}
	t.tombs[id] = now
	t.order = append(t.order, tomb{id, now})
	// Expire old tombstones and keep the bound; entries superseded by a re-add or a later
	// delete of the same id are skipped by comparing times.
	for t.head < len(t.order) && (len(t.order)-t.head > t.cfg.MaxTombstones || now.Sub(t.order[t.head].at) >= t.cfg.TombstoneTTL) {
		old := t.order[t.head]
		if at, ok := t.tombs[old.id]; ok && at.Equal(old.at) {
			delete(t.tombs, old.id)
		}
		t.order[t.head] = tomb{}
		t.head++
	}
	if t.head > 1024 && t.head > len(t.order)/2 {
		t.order = append(t.order[:0], t.order[t.head:]...)
		t.head = 0
	}
}

func (t *Table) changed() {
	if t.cfg.OnChange != nil {
		t.cfg.OnChange(t.Len())
	}
}

var _ watch.Handler = (*Table)(nil)
