package dnsfilter

import (
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/publicsuffix"
)

// Defaults of GuardConfig's caps, distinct names per sandbox and minute.
const (
	DefaultNamesPerSandbox = 300
	DefaultNamesPerDomain  = 100
	DefaultNamesPerRule    = 200
)

// GuardConfig is the operator's part of the DNS tunnelling guard, applied to every
// sandbox on top of its policy's dns.tunnelGuard. A tunnel moves data out in the names
// it asks about: in long random-looking labels (MaxLabelBits), and in many distinct
// names, each new one a new message to the attacker's name server (the caps).
//
// The caps count the distinct names a sandbox has resolved in fixed one-minute windows
// (from its first counted query). A name asked again in the same minute, in any query
// type, is free; a name the policy or the overlay denies never reaches an upstream, so
// it carries nothing out and is not counted. A new name that would go over a cap is
// REFUSED (audit rule dns.tunnelGuard) and is not counted either. With the defaults a
// sandbox that resolves under 100 names a minute, as package installs do (a handful),
// never meets a cap, and a tunnel moves at most about 300 names × 20 bytes a minute.
//
// Zero fields take the defaults; a negative field turns its check off.
type GuardConfig struct {
	// NamesPerSandbox caps the distinct names one sandbox gets resolved per minute;
	// default 300 (DefaultNamesPerSandbox).
	NamesPerSandbox int
	// NamesPerDomain caps the distinct names under one registrable domain — eTLD+1 by
	// the Public Suffix List: files.pythonhosted.org counts under pythonhosted.org, a.b.
	// example.co.uk under example.co.uk, x.github.io under itself — per sandbox and
	// minute; default 100 (DefaultNamesPerDomain). A policy's
	// dns.tunnelGuard.maxQueriesPerMinute replaces it for its sandboxes.
	NamesPerDomain int
	// NamesPerRule caps the distinct names one rule lets through (an egress rule, an
	// overlay allow, or the policy's default action) per sandbox and minute, so that a
	// wildcard spanning many registrable domains ("*", "*.com", a suffix where anyone
	// can register names) does not multiply the per-domain cap; default 200
	// (DefaultNamesPerRule).
	NamesPerRule int
	// MaxLabelBits is the highest score a query name's label may have: the bits of
	// arbitrary data it can carry in random-looking text (labelScore); default 160
	// (DefaultMaxLabelBits). A policy whose dns.tunnelGuard.maxLabelEntropy is 0 turns it
	// off for its sandboxes, as it turns its own entropy check off.
	MaxLabelBits float64
}

// withDefaults returns g with defaults applied and "off" as 0, or an error.
func (g GuardConfig) withDefaults() (GuardConfig, error) {
	if math.IsNaN(g.MaxLabelBits) || math.IsInf(g.MaxLabelBits, 0) {
		return g, fmt.Errorf("%w: Guard.MaxLabelBits %v", ErrConfig, g.MaxLabelBits)
	}
	def := func(v *int, d int) {
		switch {
		case *v == 0:
			*v = d
		case *v < 0:
			*v = 0
		}
	}
	def(&g.NamesPerSandbox, DefaultNamesPerSandbox)
	def(&g.NamesPerDomain, DefaultNamesPerDomain)
	def(&g.NamesPerRule, DefaultNamesPerRule)
	switch {
	case g.MaxLabelBits == 0:
		g.MaxLabelBits = DefaultMaxLabelBits
	case g.MaxLabelBits < 0:
		g.MaxLabelBits = 0
	}
	return g, nil
}

// nameCaps are the caps for one query; 0 is off.
type nameCaps struct{ sandbox, domain, rule int }

// nameGuard counts distinct query names per sandbox in fixed one-minute windows, in
// total, per registrable domain and per deciding rule. A name already seen this minute
// costs one map lookup under the sandbox's own lock and allocates nothing; windows are
// reused (cleared) from one minute to the next, and a sandbox idle for two minutes is
// dropped.
type nameGuard struct {
	seed      maphash.Seed
	mu        sync.RWMutex
	sandboxes map[string]*nameWindow
	nextSweep atomic.Int64 // unix nanoseconds
}

// nameWindow is one sandbox's minute. It holds at most caps.sandbox names, since a
// name over a cap is not recorded.
type nameWindow struct {
	mu      sync.Mutex
	dead    bool // dropped by sweep: look the sandbox up again
	start   time.Time
	names   map[uint64]struct{} // maphash of the name
	domains map[string]int
	rules   map[string]int
}

func newNameGuard() *nameGuard {
	return &nameGuard{seed: maphash.MakeSeed(), sandboxes: map[string]*nameWindow{}}
}

// admit records name (normalized), asked by sandbox and allowed by rule, and returns
// "" — or, when the name is new this minute and one more would exceed a cap, the reason
// it is refused, recording nothing.
func (g *nameGuard) admit(sandbox, name, rule string, caps nameCaps, now time.Time) string {
	if caps == (nameCaps{}) {
		return ""
	}
	g.sweep(now)
	h := maphash.String(g.seed, name)
	for {
		w := g.window(sandbox, now)
		w.mu.Lock()
		if w.dead {
			w.mu.Unlock()
			continue
		}
		reason := w.admit(h, name, rule, caps, now)
		w.mu.Unlock()
		return reason
	}
}

func (w *nameWindow) admit(h uint64, name, rule string, caps nameCaps, now time.Time) string {
	if now.Sub(w.start) >= time.Minute {
		w.start = now
		clear(w.names)
		clear(w.domains)
		clear(w.rules)
	}
	if _, seen := w.names[h]; seen {
		return ""
	}
	if caps.sandbox > 0 && len(w.names) >= caps.sandbox {
		return fmt.Sprintf("more than %d distinct names in a minute from this sandbox (possible DNS tunnelling)", caps.sandbox)
	}
	if caps.rule > 0 && w.rules[rule] >= caps.rule {
		return fmt.Sprintf("more than %d distinct names in a minute through rule %s (possible DNS tunnelling)", caps.rule, rule)
	}
	domain := registrableDomain(name)
	if caps.domain > 0 && w.domains[domain] >= caps.domain {
		return fmt.Sprintf("more than %d distinct names under %s in a minute (possible DNS tunnelling)", caps.domain, domain)
	}
	w.names[h] = struct{}{}
	w.rules[rule]++
	w.domains[domain]++
	return ""
}

// window returns sandbox's window, creating it.
func (g *nameGuard) window(sandbox string, now time.Time) *nameWindow {
	g.mu.RLock()
	w := g.sandboxes[sandbox]
	g.mu.RUnlock()
	if w != nil {
		return w
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w = g.sandboxes[sandbox]; w == nil {
		w = &nameWindow{start: now, names: map[uint64]struct{}{}, domains: map[string]int{}, rules: map[string]int{}}
		g.sandboxes[sandbox] = w
	}
	return w
}

// sweep drops, once a minute, the windows of sandboxes idle for two minutes (their
// counts are void anyway), so that sandboxes gone do not keep memory.
func (g *nameGuard) sweep(now time.Time) {
	next := g.nextSweep.Load()
	if now.UnixNano() < next || !g.nextSweep.CompareAndSwap(next, now.Add(time.Minute).UnixNano()) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, w := range g.sandboxes {
		w.mu.Lock()
		if now.Sub(w.start) >= 2*time.Minute {
			w.dead = true
			delete(g.sandboxes, id)
		}
		w.mu.Unlock()
	}
}

// registrableDomain is name's eTLD+1 by the Public Suffix List (an unlisted top-level
// domain counts as a public suffix: a.b.internal is under b.internal), or name itself
// when it is a public suffix or a single label.
func registrableDomain(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name
}
