package egressd

import (
	"net/netip"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath"
)

// Flow audit defaults: each sandbox may open FlowAuditRate denied or allowed flow
// records per second with bursts of FlowAuditBurst; what goes over is counted into
// one suppressed record per sandbox and flow window.
const (
	DefaultFlowAuditRate  = 100
	DefaultFlowAuditBurst = 1000
	// maxOpenFlows bounds the flows held open across all sandboxes; a flow that
	// finds the table full is written at once, with the counts of its first packet.
	maxOpenFlows = 1 << 16
	// sameFlowSlack is how far apart the event's and the kernel's first-packet times
	// may be (clock conversion) and still name the same flow.
	sameFlowSlack = 50 * time.Millisecond
	// activeTimeout bounds how long a busy flow goes unrecorded: a flow still active
	// after it gets a record for what it did so far, and the next record continues it
	// (as NetFlow's active timeout does).
	activeTimeout = time.Minute
)

// flowAudit folds datapath events into one audit record per flow (audit/README.md,
// "Flow records"): the first packet of a denied flow opens it, packets of the same
// 5-tuple less than window after the last one count into it, and it is written when
// it has been idle for window, when it has run for activeTimeout (the next record
// continues it), or when egressd stops. A datapath that counts flows in the kernel
// (datapath.FlowCounter) reports only first packets; the kernel's counts are read at
// the flush. An allowed flow (KindFlow) the kernel counts is folded the same way;
// one it does not count is written at once, without counts. Every record a sandbox
// opens takes a token of its rate limiter; without one, the flow is counted in the
// sandbox's next suppressed record. Not safe for concurrent use: auditEvents owns it.
type flowAudit struct {
	window     time.Duration
	counter    datapath.FlowCounter // nil: every dropped packet is an event
	limit      *audit.Limiter       // per sandbox; suppressed records per window
	write      func(audit.Record)
	onSuppress func(n int)

	open map[flowKey]*openFlow
}

type flowKey struct {
	sandbox  string
	kind     datapath.Kind
	proto    datapath.Proto
	src, dst netip.AddrPort
	refused  bool
}

type openFlow struct {
	ev             datapath.Event // the first packet's
	rec            audit.Record
	last           time.Time
	packets, bytes uint64
	// since is the start of the current record (the first packet, or the previous
	// record's end under activeTimeout); base the kernel counts already recorded.
	since time.Time
	base  datapath.FlowCount
	// suppressed: over the sandbox's rate, counted in its suppressed record; held
	// open only so that its later packets are not counted as more flows.
	suppressed bool
}

func newFlowAudit(window time.Duration, counter datapath.FlowCounter, limit rate.Limit, burst int, write func(audit.Record)) *flowAudit {
	return &flowAudit{window: window, counter: counter, write: write, onSuppress: func(int) {}, open: map[flowKey]*openFlow{},
		limit: audit.NewLimiter(audit.RateLimit{Rate: float64(limit), Burst: burst, Window: window})}
}

// add takes one event and the record it would be on its own.
func (a *flowAudit) add(ev datapath.Event, rec audit.Record) {
	if ev.Kind == datapath.KindFlow && !a.counted(ev) {
		if a.admit(ev) {
			a.write(rec)
		}
		return
	}
	k := flowKey{sandbox: ev.Sandbox, kind: ev.Kind, proto: ev.Proto, src: ev.Src, dst: ev.Dst, refused: ev.Refused}
	if f, ok := a.open[k]; ok {
		if ev.Time.Sub(f.last) < a.window {
			f.last = ev.Time
			f.packets++
			f.bytes += uint64(ev.Bytes)
			return
		}
		a.flush(f)
		delete(a.open, k)
	}
	f := &openFlow{ev: ev, rec: rec, last: ev.Time, since: ev.Time, packets: 1, bytes: uint64(ev.Bytes), suppressed: !a.admit(ev)}
	if len(a.open) >= maxOpenFlows {
		a.flush(f)
		return
	}
	a.open[k] = f
}

// counted reports whether the kernel counts ev's flow.
func (a *flowAudit) counted(ev datapath.Event) bool {
	if a.counter == nil {
		return false
	}
	_, ok := a.counter.FlowCount(ev)
	return ok
}

// admit takes a token of the event's sandbox, or counts the event as suppressed.
func (a *flowAudit) admit(ev datapath.Event) bool {
	if a.limit.AllowSandbox(audit.SourceBPF, ev.Sandbox, ev.Time) {
		return true
	}
	a.onSuppress(1)
	return false
}

// tick writes the flows idle for a window at now and the suppressed records whose
// window has passed.
func (a *flowAudit) tick(now time.Time) {
	for k, f := range a.open {
		if now.Sub(f.last) < a.window && now.Sub(f.since) < activeTimeout {
			continue
		}
		a.refresh(f)
		if now.Sub(f.last) >= a.window {
			a.flush(f)
			delete(a.open, k)
			continue
		}
		if now.Sub(f.since) >= activeTimeout {
			a.flush(f) // still active: this record ends here, the next continues
			f.base = datapath.FlowCount{Packets: f.base.Packets + f.packets, Bytes: f.base.Bytes + f.bytes}
			f.packets, f.bytes, f.since = 0, 0, f.last
		}
	}
	for _, r := range a.limit.Flush(now, false) {
		a.write(r)
	}
}

// refresh takes the kernel's counts of a flow it counts (less what earlier records of
// the flow already carry).
func (a *flowAudit) refresh(f *openFlow) {
	if a.counter == nil {
		return
	}
	c, ok := a.counter.FlowCount(f.ev)
	if !ok || c.First.Sub(f.ev.Time).Abs() > sameFlowSlack {
		return
	}
	f.packets = max(f.packets, c.Packets-min(c.Packets, f.base.Packets))
	f.bytes = max(f.bytes, c.Bytes-min(c.Bytes, f.base.Bytes))
	if c.Last.After(f.last) {
		f.last = c.Last
	}
}

// close writes every open flow and pending suppressed record.
func (a *flowAudit) close() {
	for k, f := range a.open {
		a.refresh(f)
		a.flush(f)
		delete(a.open, k)
	}
	for _, r := range a.limit.Flush(time.Now(), true) {
		a.write(r)
	}
}

func (a *flowAudit) flush(f *openFlow) {
	if f.suppressed {
		return
	}
	rec := f.rec
	rec.Time = f.since
	rec.Extra = make(map[string]any, len(f.rec.Extra)+4)
	for k, v := range f.rec.Extra {
		rec.Extra[k] = v
	}
	rec.Extra["packets"] = f.packets
	rec.Extra["bytes"] = f.bytes
	rec.Extra["last_seen"] = f.last.UTC().Format(time.RFC3339Nano)
	if f.ev.Refused {
		rec.Extra["refused"] = true
	}
	a.write(rec)
}
