package egressd

import (
	"net/netip"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath"
)

func dropEvent(sandbox string, at time.Time, dport uint16) datapath.Event {
	return datapath.Event{Time: at, Sandbox: sandbox, Kind: datapath.KindDrop, Reason: datapath.ReasonDefaultDeny,
		Proto: datapath.ProtoUDP, Src: netip.MustParseAddrPort("10.0.0.2:4000"),
		Dst: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), dport), Bytes: 100}
}

// TestFlowAuditOneRecordPerFlow: packets of a 5-tuple closer than the window are one
// record (counts, first and last seen); a gap of a window starts a new flow.
func TestFlowAuditOneRecordPerFlow(t *testing.T) {
	var got []audit.Record
	a := newFlowAudit(time.Second, nil, 1000, 1000, func(r audit.Record) { got = append(got, r) })
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		ev := dropEvent("sb1", t0.Add(time.Duration(i)*300*time.Millisecond), 53)
		a.add(ev, audit.Record{Time: ev.Time, SandboxID: "sb1", Action: "deny"})
	}
	a.tick(t0.Add(1500 * time.Millisecond)) // last packet at 1.2 s: not idle yet
	if len(got) != 0 {
		t.Fatalf("flow written before it was idle: %+v", got)
	}
	ev := dropEvent("sb1", t0.Add(5*time.Second), 53) // a window later: a new flow
	a.add(ev, audit.Record{Time: ev.Time, SandboxID: "sb1", Action: "deny"})
	a.close()
	if len(got) != 2 {
		t.Fatalf("%d records, want 2: %+v", len(got), got)
	}
	if got[0].Extra["packets"] != uint64(5) || got[0].Extra["bytes"] != uint64(500) || !got[0].Time.Equal(t0) {
		t.Errorf("first flow: %+v", got[0])
	}
	if got[0].Extra["last_seen"] != t0.Add(1200*time.Millisecond).UTC().Format(time.RFC3339Nano) {
		t.Errorf("first flow last_seen %v", got[0].Extra["last_seen"])
	}
	if got[1].Extra["packets"] != uint64(1) {
		t.Errorf("second flow: %+v", got[1])
	}
}

// TestFlowAuditRateLimit: a sandbox over its rate gets its flows counted in one
// suppressed record per window; records + suppressed = flows; other sandboxes are
// not limited by it.
func TestFlowAuditRateLimit(t *testing.T) {
	var got []audit.Record
	a := newFlowAudit(time.Second, nil, 10, 20, func(r audit.Record) { got = append(got, r) })
	suppressed := 0
	a.onSuppress = func(n int) { suppressed += n }
	t0 := time.Unix(1000, 0)
	const flows = 500
	for i := range flows {
		ev := dropEvent("flood", t0.Add(time.Duration(i)*time.Millisecond), uint16(1000+i))
		a.add(ev, audit.Record{Time: ev.Time, SandboxID: "flood", Action: "deny"})
		// each flow sends a second packet: it must not count as another flow
		ev.Time = ev.Time.Add(time.Microsecond)
		a.add(ev, audit.Record{Time: ev.Time, SandboxID: "flood", Action: "deny"})
	}
	quiet := dropEvent("quiet", t0.Add(time.Millisecond), 80)
	a.add(quiet, audit.Record{Time: quiet.Time, SandboxID: "quiet", Action: "deny"})
	a.tick(t0.Add(3 * time.Second))
	a.close()
	written, counted, quietSeen := 0, uint64(0), false
	for _, r := range got {
		switch {
		case r.SandboxID == "quiet":
			quietSeen = true
		case r.Action == audit.ActionSuppressed:
			counted += r.Extra["suppressed"].(uint64)
		default:
			written++
		}
	}
	if !quietSeen {
		t.Error("the quiet sandbox's flow was suppressed by the flooding one")
	}
	if written > 20+6 || written < 20 {
		t.Errorf("%d flow records written at 10/s burst 20 over 0.5 s", written)
	}
	if uint64(written)+counted != flows || int(counted) != suppressed {
		t.Errorf("written %d + suppressed %d != %d flows (metric %d)", written, counted, flows, suppressed)
	}
}

type fakeCounter struct {
	c  datapath.FlowCount
	fn func() datapath.FlowCount // when set, the counts now
}

func (f fakeCounter) FlowCount(datapath.Event) (datapath.FlowCount, bool) {
	if f.fn != nil {
		return f.fn(), true
	}
	return f.c, true
}
func (f fakeCounter) FlowWindow() time.Duration { return time.Second }

// TestFlowAuditKernelCounts: with a FlowCounter, the record carries the kernel's
// counts, and a flow the kernel still sees active stays open.
func TestFlowAuditKernelCounts(t *testing.T) {
	var got []audit.Record
	t0 := time.Unix(1000, 0)
	fc := &fakeCounter{c: datapath.FlowCount{First: t0, Last: t0.Add(2 * time.Second), Packets: 42, Bytes: 4200}}
	a := newFlowAudit(time.Second, fc, 100, 100, func(r audit.Record) { got = append(got, r) })
	ev := dropEvent("sb1", t0, 443)
	a.add(ev, audit.Record{Time: ev.Time, SandboxID: "sb1", Action: "deny"})
	a.tick(t0.Add(2500 * time.Millisecond)) // kernel's last packet 0.5 s ago: open
	if len(got) != 0 {
		t.Fatalf("written while the kernel still counts it: %+v", got)
	}
	a.tick(t0.Add(3500 * time.Millisecond))
	if len(got) != 1 || got[0].Extra["packets"] != uint64(42) || got[0].Extra["bytes"] != uint64(4200) {
		t.Fatalf("records %+v", got)
	}
}

// TestFlowAuditAllowedFlowActiveTimeout: an allowed flow the kernel counts is one record
// when it goes quiet; a flow busy for longer than activeTimeout gets a record per
// activeTimeout, each with what it did in that stretch (the counts add up).
func TestFlowAuditAllowedFlowActiveTimeout(t *testing.T) {
	var got []audit.Record
	t0 := time.Unix(1000, 0)
	now := t0
	// 10 packets of 100 bytes a second, until t0+150s.
	fc := &fakeCounter{fn: func() datapath.FlowCount {
		end := now
		if stop := t0.Add(150 * time.Second); end.After(stop) {
			end = stop
		}
		n := uint64(end.Sub(t0)/time.Second) * 10
		return datapath.FlowCount{First: t0, Last: end, Packets: n, Bytes: n * 100}
	}}
	a := newFlowAudit(time.Second, fc, 100, 100, func(r audit.Record) { got = append(got, r) })
	ev := dropEvent("sb1", t0, 443)
	ev.Kind = datapath.KindFlow
	a.add(ev, audit.Record{Time: ev.Time, SandboxID: "sb1", Action: "allow"})
	for ; now.Before(t0.Add(160 * time.Second)); now = now.Add(250 * time.Millisecond) {
		a.tick(now)
	}
	if len(got) != 3 {
		t.Fatalf("%d records, want 3 (two active timeouts, then the quiet end): %+v", len(got), got)
	}
	var packets uint64
	for _, r := range got {
		packets += r.Extra["packets"].(uint64)
	}
	if packets != 1500 || !got[0].Time.Equal(t0) || !got[1].Time.After(got[0].Time) {
		t.Errorf("records add up to %d packets, want 1500: %+v", packets, got)
	}
}
