package audit

import (
	"net/netip"
	"sync"
	"time"
)

// RateLimit bounds how many records one sandbox (or, for refusals without a sandbox,
// one client address) may write per source, so that a flood of decisions it provokes
// cannot fill the disk or crowd out other sandboxes' records. What goes over is not
// written but counted, and once per SuppressWindow the key gets one record
// {"action":"suppressed","extra":{"suppressed":N,"last_seen":...}}: records +
// suppressed counts = decisions. The zero value limits nothing.
type RateLimit struct {
	// Rate is the records per second each sandbox may write per source (dns, l7,
	// gateway, ingress, credential), and each client address for a record without a
	// sandbox that is not a gateway refusal (a DNS query from an unknown address);
	// 0 means no limit.
	Rate float64 `yaml:"rate"`
	// Burst is how many records a key may write at once above Rate; default Rate.
	Burst int `yaml:"burst"`
	// RefusalRate is the records per second of gateway refusals (source gateway or
	// ingress, action deny: 400, 401, 403, 404, ...) per client address (IPv4 address,
	// IPv6 /64), whichever sandbox they name, so that an anonymous client's junk
	// requests take no sandbox's budget; 0 means no limit.
	RefusalRate float64 `yaml:"refusalRate"`
	// RefusalBurst is RefusalRate's burst; default RefusalRate.
	RefusalBurst int `yaml:"refusalBurst"`
	// Window is how long a key's suppressed count gathers before its suppressed record
	// is due (Flush); default SuppressWindow. egressd's flow audit uses its flow window.
	Window time.Duration `yaml:"-"`
}

// DefaultRateLimit is the rate limit airlock's servers use (stack.DefaultAuditConfig):
// 100 records/s with bursts of 1000 per sandbox and source, and 20 refusals/s with
// bursts of 100 per gateway client address. Flow records (source bpf) are limited by
// egressd itself with the same figures (egressd.DefaultFlowAuditRate).
func DefaultRateLimit() RateLimit {
	return RateLimit{Rate: 100, Burst: 1000, RefusalRate: 20, RefusalBurst: 100}
}

// SuppressWindow is how long a key's suppressed count gathers before its suppressed
// record is written (RateLimit.Window's default).
const SuppressWindow = time.Second

// maxLimitKeys bounds the keys a Limiter tracks; when it is full, a new key shares
// one overflow bucket per source (and kind) until idle keys are forgotten.
const maxLimitKeys = 1 << 16

// limitKey names one bucket: a sandbox's records of one source, or one client
// address's (refusals, unknown sources).
type limitKey struct {
	source  Source
	sandbox string
	addr    netip.Addr // or prefix address of an IPv6 /64
	refusal bool
}

type bucket struct {
	tokens      float64
	at          time.Time
	suppressed  uint64
	first, last time.Time
}

// Limiter is a token bucket per key (see RateLimit) with the suppressed counts of
// each. Allow decides one record; Flush returns the suppressed records due. Safe for
// concurrent use. The Writer applies one to every record it is given
// (Config.RateLimit); egressd's flow audit keeps its own for flows.
type Limiter struct {
	cfg  RateLimit
	mu   sync.Mutex
	keys map[limitKey]*bucket
}

// NewLimiter returns a Limiter for cfg (a zero Burst defaults to the rate).
func NewLimiter(cfg RateLimit) *Limiter {
	if cfg.Burst <= 0 {
		cfg.Burst = max(1, int(cfg.Rate))
	}
	if cfg.RefusalBurst <= 0 {
		cfg.RefusalBurst = max(1, int(cfg.RefusalRate))
	}
	if cfg.Window <= 0 {
		cfg.Window = SuppressWindow
	}
	return &Limiter{cfg: cfg, keys: map[limitKey]*bucket{}}
}

// key returns r's bucket and its rate and burst; ok is false for records that are not
// limited: loss and suppressed records, policy changes, flow records (limited by
// egressd per flow), and sources whose rate is 0.
func (l *Limiter) key(r *Record) (k limitKey, rate float64, burst int, ok bool) {
	switch {
	case r.Action == ActionLoss || r.Action == ActionSuppressed:
		return k, 0, 0, false
	case r.Source == SourcePolicy || r.Source == SourceBPF:
		return k, 0, 0, false
	}
	k.source = r.Source
	if (r.Source == SourceGateway || r.Source == SourceIngress || r.Source == SourceControl) && r.Action == "deny" {
		k.refusal, k.addr = true, clientPrefix(r.Src)
		return k, l.cfg.RefusalRate, l.cfg.RefusalBurst, l.cfg.RefusalRate > 0
	}
	if r.SandboxID != "" {
		k.sandbox = r.SandboxID
	} else {
		k.addr = clientPrefix(r.Src)
	}
	return k, l.cfg.Rate, l.cfg.Burst, l.cfg.Rate > 0
}

// clientPrefix is the address of "ip" or "ip:port", IPv6 masked to its /64 (one
// client usually holds a whole /64); the zero Addr when src is neither.
func clientPrefix(src string) netip.Addr {
	a, err := netip.ParseAddr(src)
	if err != nil {
		ap, err := netip.ParseAddrPort(src)
		if err != nil {
			return netip.Addr{}
		}
		a = ap.Addr()
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return a
}

// Allow takes a token of r's key at r.Time (time.Now when zero) and reports whether r
// may be written; a record over its key's rate is counted into the key's next
// suppressed record.
func (l *Limiter) Allow(r *Record) bool {
	k, rate, burst, ok := l.key(r)
	if !ok {
		return true
	}
	now := r.Time
	if now.IsZero() {
		now = time.Now()
	}
	return l.take(k, rate, burst, now)
}

// AllowSandbox takes a token of sandbox's bucket for source at time at, whatever the
// source (flow records included), with RateLimit.Rate and Burst; false counts one
// into the sandbox's next suppressed record. egressd's flow audit admits each flow so.
func (l *Limiter) AllowSandbox(source Source, sandbox string, at time.Time) bool {
	if l.cfg.Rate <= 0 {
		return true
	}
	return l.take(limitKey{source: source, sandbox: sandbox}, l.cfg.Rate, l.cfg.Burst, at)
}

// take takes a token of k's bucket at now, or counts a suppressed record.
func (l *Limiter) take(k limitKey, rate float64, burst int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.keys[k]
	if b == nil {
		if len(l.keys) >= maxLimitKeys {
			k = limitKey{source: k.source, refusal: k.refusal, sandbox: "\x00overflow"}
			b = l.keys[k]
		}
		if b == nil {
			b = &bucket{tokens: float64(burst), at: now}
			l.keys[k] = b
		}
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(float64(burst), b.tokens+d.Seconds()*rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.suppressed == 0 {
		b.first = now
	}
	b.suppressed++
	if now.After(b.last) {
		b.last = now
	}
	return false
}

// Flush returns the suppressed records of the keys whose first suppressed record is
// at least RateLimit.Window before now (every pending one when all is set), and
// forgets keys that are idle (bucket full, nothing pending).
func (l *Limiter) Flush(now time.Time, all bool) []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Record
	for k, b := range l.keys {
		if b.suppressed > 0 && (all || now.Sub(b.first) >= l.cfg.Window) {
			r := Record{Time: b.first, SandboxID: k.sandbox, Source: k.source, Action: ActionSuppressed,
				Reason: "audit rate limit", Extra: map[string]any{"suppressed": b.suppressed,
					"last_seen": b.last.UTC().Format(time.RFC3339Nano)}}
			if k.sandbox == "\x00overflow" {
				r.SandboxID, r.Reason = "", "audit rate limit (too many keys: shared bucket)"
			}
			if k.addr.IsValid() {
				r.Src = k.addr.String()
			}
			out = append(out, r)
			b.suppressed = 0
			continue
		}
		rate, burst := l.cfg.Rate, l.cfg.Burst
		if k.refusal {
			rate, burst = l.cfg.RefusalRate, l.cfg.RefusalBurst
		}
		if b.suppressed == 0 && b.tokens+now.Sub(b.at).Seconds()*rate >= float64(burst) {
			delete(l.keys, k)
		}
	}
	return out
}
