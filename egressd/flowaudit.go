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
)

// flowAudit folds datapath events into one audit record per flow (audit/README.md,
// "Flow records"): the first packet of a denied flow opens it, packets of the same
// 5-tuple less than window after the last one count into it, and it is written when
// it has been idle for window, or when egressd stops. A datapath that counts denied
// flows in the kernel (datapath.DropCounter) reports only first packets; the kernel's
// counts are read at the flush. Allowed flows (KindFlow, already one event per flow)
// are written at once. Every record a sandbox opens takes a token of its rate
// limiter; without one, the flow is counted in the sandbox's next suppressed record.
// Not safe for concurrent use: auditEvents owns it.
type flowAudit struct {
	window     time.Duration
	counter    datapath.DropCounter // nil: every dropped packet is an event
	limit      rate.Limit
	burst      int
	write      func(audit.Record)
	onSuppress func(n int)

	open    map[flowKey]*openFlow
	budgets map[string]*budget
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
	// suppressed: over the sandbox's rate, counted in its suppressed record; held
	// open only so that its later packets are not counted as more flows.
	suppressed bool
}

// budget is a sandbox's record rate limiter and what it suppressed since its last
// suppressed record.
type budget struct {
	lim         *rate.Limiter
	flows       uint64
	first, last time.Time
}

func newFlowAudit(window time.Duration, counter datapath.DropCounter, limit rate.Limit, burst int, write func(audit.Record)) *flowAudit {
	return &flowAudit{window: window, counter: counter, limit: limit, burst: burst, write: write,
		onSuppress: func(int) {}, open: map[flowKey]*openFlow{}, budgets: map[string]*budget{}}
}

// add takes one event and the record it would be on its own.
func (a *flowAudit) add(ev datapath.Event, rec audit.Record) {
	if ev.Kind == datapath.KindFlow {
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
	f := &openFlow{ev: ev, rec: rec, last: ev.Time, packets: 1, bytes: uint64(ev.Bytes), suppressed: !a.admit(ev)}
	if len(a.open) >= maxOpenFlows {
		a.flush(f)
		return
	}
	a.open[k] = f
}

// admit takes a token of the event's sandbox, or counts the event as suppressed.
func (a *flowAudit) admit(ev datapath.Event) bool {
	b := a.budgets[ev.Sandbox]
	if b == nil {
		b = &budget{lim: rate.NewLimiter(a.limit, a.burst)}
		a.budgets[ev.Sandbox] = b
	}
	if b.lim.AllowN(ev.Time, 1) {
		return true
	}
	if b.flows == 0 {
		b.first = ev.Time
	}
	b.flows++
	b.last = ev.Time
	a.onSuppress(1)
	return false
}

// tick writes the flows idle for a window at now and the suppressed records whose
// window has passed.
func (a *flowAudit) tick(now time.Time) {
	for k, f := range a.open {
		if now.Sub(f.last) < a.window {
			continue
		}
		if a.refresh(f); now.Sub(f.last) < a.window {
			continue
		}
		a.flush(f)
		delete(a.open, k)
	}
	for id, b := range a.budgets {
		if b.flows > 0 && now.Sub(b.first) >= a.window {
			a.writeSuppressed(id, b)
		}
		if b.flows == 0 && b.lim.TokensAt(now) >= float64(a.burst) {
			delete(a.budgets, id)
		}
	}
}

// refresh takes the kernel's counts of a flow it counts.
func (a *flowAudit) refresh(f *openFlow) {
	if a.counter == nil || f.ev.Kind != datapath.KindDrop {
		return
	}
	c, ok := a.counter.DropCount(f.ev)
	if !ok || c.First.Sub(f.ev.Time).Abs() > sameFlowSlack {
		return
	}
	f.packets = max(f.packets, c.Packets)
	f.bytes = max(f.bytes, c.Bytes)
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
	for id, b := range a.budgets {
		if b.flows > 0 {
			a.writeSuppressed(id, b)
		}
	}
}

func (a *flowAudit) flush(f *openFlow) {
	if f.suppressed {
		return
	}
	rec := f.rec
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

func (a *flowAudit) writeSuppressed(id string, b *budget) {
	a.write(audit.Record{
		Time: b.first, SandboxID: id, Source: audit.SourceBPF, Action: audit.ActionSuppressed,
		Extra: map[string]any{"suppressed": b.flows, "last_seen": b.last.UTC().Format(time.RFC3339Nano)},
	})
	b.flows = 0
}
