package dnsfilter

import (
	"sync"
	"time"
)

// rateGuard counts distinct query names per sandbox and parent domain in fixed
// one-minute windows: DNS tunnels encode data in ever-new names under one domain.
type rateGuard struct {
	mu      sync.Mutex
	windows map[string]*window
}

type window struct {
	start time.Time
	names map[string]struct{}
}

// maxWindows bounds the guard's memory; beyond it, finished windows are dropped.
const maxWindows = 100_000

func newRateGuard() *rateGuard { return &rateGuard{windows: map[string]*window{}} }

// exceeded records name for sandbox and reports whether it is over limit distinct names
// under its parent this minute. Repeated names never count twice.
func (g *rateGuard) exceeded(sandbox, name string, limit int, now time.Time) bool {
	key := sandbox + " " + parent(name)
	g.mu.Lock()
	defer g.mu.Unlock()
	w := g.windows[key]
	if w == nil || now.Sub(w.start) >= time.Minute {
		if len(g.windows) >= maxWindows {
			for k, old := range g.windows {
				if now.Sub(old.start) >= time.Minute {
					delete(g.windows, k)
				}
			}
		}
		w = &window{start: now, names: map[string]struct{}{}}
		g.windows[key] = w
	}
	if _, seen := w.names[name]; seen {
		return false
	}
	if len(w.names) >= limit {
		return true
	}
	w.names[name] = struct{}{}
	return false
}
