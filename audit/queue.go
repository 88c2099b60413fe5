package audit

import "sync/atomic"

// queueSources are the sources that each hold a reserved share of the writer's queue;
// every other source (one this package does not know) shares the last slot.
var queueSources = [...]Source{SourceDNS, SourceBPF, SourceL7, SourceCredential, SourceGateway, SourceIngress, SourcePolicy, SourceExecd, SourceControl}

// queueSlots is the number of reserved shares: one per queueSources entry and one for
// the rest.
const queueSlots = len(queueSources) + 1

func sourceSlot(s Source) int {
	for i, q := range queueSources {
		if q == s {
			return i
		}
	}
	return len(queueSources)
}

// queued is a record in the writer's queue and the part of the queue it holds.
type queued struct {
	rec    Record
	shared bool
}

// shares divides the writer's queue (Config.QueueSize records) so that a flood of one
// source cannot take the room of another: half of it is reserved, in equal shares,
// for each source, and the other half is taken by whichever source needs it first. A
// source whose share and the common half are full loses its own records (counted in
// its loss record) while the others' still have room.
type shares struct {
	reserved int64 // per slot
	common   int64
	inRes    [queueSlots]atomic.Int64
	inCommon atomic.Int64
}

func newShares(size int) *shares {
	r := int64(size / (2 * queueSlots))
	return &shares{reserved: r, common: int64(size) - r*int64(queueSlots)}
}

// take claims room for one record of s: in its reserved share, else in the common
// part (shared true); ok is false when both are full.
func (q *shares) take(s Source) (shared, ok bool) {
	res := &q.inRes[sourceSlot(s)]
	if res.Add(1) <= q.reserved {
		return false, true
	}
	res.Add(-1)
	if q.inCommon.Add(1) <= q.common {
		return true, true
	}
	q.inCommon.Add(-1)
	return false, false
}

// release gives back the room of a record taken off the queue.
func (q *shares) release(e *queued) {
	if e.shared {
		q.inCommon.Add(-1)
		return
	}
	q.inRes[sourceSlot(e.rec.Source)].Add(-1)
}
