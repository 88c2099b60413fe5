package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Global counter indexes of the stats map (airlock.c ST_*).
const (
	stPass       = 0
	stDrop       = 1
	stFlowNew    = 2
	stEventsLost = 3
)

// evfSocket is event.flags EVF_SOCKET (airlock.c).
const evfSocket = 1

// FlowCount implements datapath.FlowCounter from e's 5-tuple's entry in drop_seen
// (KindDrop) or flows (KindFlow, counted with Policy.CountFlows), read, not removed:
// the kernel starts the next flow of the 5-tuple over it.
func (d *Datapath) FlowCount(e datapath.Event) (datapath.FlowCount, bool) {
	d.sbx.Lock()
	s, ok := d.sbx.Lookup(e.Sandbox)
	var idx, gen uint32
	var counting bool
	if ok {
		idx, gen, counting = s.idx, s.gen, s.policy.CountFlows
	}
	d.sbx.Unlock()
	if !ok {
		return datapath.FlowCount{}, false
	}
	k := airlockFlowKey{Idx: idx, Proto: uint8(e.Proto), Family: 4, Lport: e.Src.Port(), Rport: e.Dst.Port(), Raddr: e.Dst.Addr().As16()}
	if e.Dst.Addr().Is6() && !e.Dst.Addr().Is4In6() {
		k.Family = 6
	}
	var v airlockDropVal
	switch e.Kind {
	case datapath.KindDrop:
		if err := d.objs.DropSeen.Lookup(&k, &v); err != nil {
			return datapath.FlowCount{}, false
		}
	case datapath.KindFlow:
		var f airlockFlowVal
		if !counting || d.objs.Flows.Lookup(&k, &f) != nil || f.Gen != gen {
			return datapath.FlowCount{}, false
		}
		v = airlockDropVal{FirstNs: f.FirstNs, LastNs: f.LastNs, Packets: f.Packets, Bytes: f.Bytes}
	default:
		return datapath.FlowCount{}, false
	}
	now, mono := time.Now(), monoNow()
	return datapath.FlowCount{
		First:   now.Add(time.Duration(v.FirstNs) - mono),
		Last:    now.Add(time.Duration(v.LastNs) - mono),
		Packets: v.Packets,
		Bytes:   v.Bytes,
	}, true
}

// FlowWindow implements datapath.FlowCounter: Config.FlowWindow.
func (d *Datapath) FlowWindow() time.Duration { return d.cfg.FlowWindow }

// readEvents drains the ring buffer into the Events channel until Close.
func (d *Datapath) readEvents() {
	defer close(d.readerDone)
	defer close(d.events)
	var rec ringbuf.Record
	for {
		if err := d.rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			d.log.Warn("ring buffer read failed", "err", err)
			continue
		}
		var raw airlockEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
			d.lostLocal.Add(1)
			continue
		}
		select {
		case d.events <- d.decode(&raw):
		default:
			d.lostLocal.Add(1)
		}
	}
}

func (d *Datapath) decode(r *airlockEvent) datapath.Event {
	e := datapath.Event{
		Time:    time.Now().Add(time.Duration(r.TsNs) - monoNow()),
		Kind:    datapath.Kind(r.Kind),
		Reason:  datapath.Reason(r.Reason),
		Proto:   datapath.Proto(r.Proto),
		Src:     netip.AddrPortFrom(netip.AddrFrom16(r.Saddr).Unmap(), r.Sport),
		Dst:     netip.AddrPortFrom(netip.AddrFrom16(r.Daddr).Unmap(), r.Dport),
		Rule:    r.Rule,
		Refused: r.Flags&evfSocket != 0,
		Bytes:   r.Len,
	}
	e.Process = procOf(&r.Proc)
	if r.Family == 6 {
		e.Src = netip.AddrPortFrom(netip.AddrFrom16(r.Saddr), r.Sport)
		e.Dst = netip.AddrPortFrom(netip.AddrFrom16(r.Daddr), r.Dport)
	}
	if id, ok := d.idCache.Load(cacheKey(r.Idx, r.Gen)); ok {
		e.Sandbox = id.(string)
	}
	return e
}

// procOf is the process p names, nil when it names none (tgid 0).
func procOf(p *airlockProcInfo) *datapath.Process {
	if p.Tgid == 0 {
		return nil
	}
	out := &datapath.Process{PID: p.Tgid, TID: p.Tid, PPID: p.Ppid, PGID: p.Pgid,
		NSPID: p.NsTgid, NSPGID: p.NsPgid, Comm: cstring(p.Comm[:]), Exe: cstring(p.Exe[:]),
		Start: time.Duration(p.StartNs), ArgsCut: p.ArgsCut != 0}
	if n := min(int(p.ArgsLen), len(p.Args)); n > 0 {
		args := make([]byte, n)
		for i := range n {
			args[i] = byte(p.Args[i])
		}
		out.Args = strings.Split(strings.TrimRight(string(args), "\x00"), "\x00")
	}
	return out
}

// cstring is b up to its first NUL.
func cstring[T ~int8 | ~uint8](b []T) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// Stats implements datapath.Datapath. It iterates the flow table and each sandbox's
// learned map.
func (d *Datapath) Stats() (datapath.Stats, error) {
	st := datapath.Stats{Backend: datapath.BackendEBPF, Sandboxes: map[string]datapath.SandboxStats{}}
	global := make([]uint64, 8)
	for i := range uint32(4) {
		var per []uint64
		if err := d.objs.Stats.Lookup(i, &per); err != nil {
			return st, fmt.Errorf("read stats: %w", err)
		}
		for _, v := range per {
			global[i] += v
		}
	}
	st.Passed, st.Dropped, st.FlowsNew = global[stPass], global[stDrop], global[stFlowNew]
	st.EventsLost = global[stEventsLost] + d.lostLocal.Load()

	flows := map[uint32]int{}
	var (
		k airlockFlowKey
		v airlockFlowVal
	)
	it := d.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		flows[k.Idx]++
		st.Flows++
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("list flows: %w", err)
	}

	d.sbx.Lock()
	defer d.sbx.Unlock()
	for _, s := range d.sbx.All() {
		ss := datapath.SandboxStats{Rules: s.nRules, Flows: flows[s.idx]}
		var per []airlockSbxCounters
		if err := d.objs.SbxStats.Lookup(s.idx, &per); err == nil {
			for _, c := range per {
				ss.Passed += c.Pass
				ss.Dropped += c.Drop
				ss.FlowsNew += c.Flows
			}
		}
		ss.Learned = countEntries(s.learned)
		st.Sandboxes[s.id] = ss
	}
	return st, nil
}

func countEntries(m *bpf.Map) int {
	if m == nil {
		return 0
	}
	var (
		k [16]byte
		v airlockLearnedVal
		n int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}
