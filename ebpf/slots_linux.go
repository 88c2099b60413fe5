package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	bpf "github.com/cilium/ebpf"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Slots: a sandbox index's inner maps (rules4_of, rules6_of, learned_of entries) are
// installed once and reused by every sandbox that gets the index. Installing an inner
// map waits for an RCU grace period (the kernel makes sure no program still runs with
// the map it replaces: ~8 to 16 ms each on a 2-core machine, three per sandbox), so a
// sandbox attached on a warm slot only fills empty maps, and a detached sandbox's maps
// are emptied, not removed. A background warmer keeps warmSlots free slots ready; their
// grace periods overlap (concurrent waiters share one).

// warmSlots is how many free slots the warmer keeps ready ahead of attaches.
const warmSlots = 64

// slot is one index's installed inner maps, empty while free.
type slot struct{ rules4, rules6, learned *bpf.Map }

func (sl *slot) close() {
	for _, m := range []*bpf.Map{sl.rules4, sl.rules6, sl.learned} {
		if m != nil {
			m.Close()
		}
	}
}

// newSlot creates idx's inner maps and installs them (the three installs in parallel,
// so that they wait for the same grace period).
func (d *Datapath) newSlot(idx uint32) (*slot, error) {
	sl := &slot{}
	var err error
	if sl.rules4, err = bpf.NewMap(d.innerSpecs.rules4); err == nil {
		if sl.rules6, err = bpf.NewMap(d.innerSpecs.rules6); err == nil {
			sl.learned, err = bpf.NewMap(d.innerSpecs.learned)
		}
	}
	if err != nil {
		sl.close()
		return nil, fmt.Errorf("create inner maps: %w", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, p := range []struct{ outer, inner *bpf.Map }{
		{d.objs.Rules4Of, sl.rules4}, {d.objs.Rules6Of, sl.rules6}, {d.objs.LearnedOf, sl.learned},
	} {
		wg.Go(func() { errs[i] = p.outer.Put(idx, p.inner) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		sl.close()
		return nil, fmt.Errorf("install inner maps: %w", err)
	}
	path := d.learnedPin(idx)
	_ = os.Remove(path)
	if err := sl.learned.Pin(path); err != nil {
		sl.close()
		return nil, fmt.Errorf("pin the learned map: %w", err)
	}
	return sl, nil
}

// learnedPin is where idx's learned map is pinned while installed: a restarted
// egressd reopens an adopted sandbox's learned map from there (openLearned), since
// opening a map by its id needs CAP_SYS_ADMIN, which egressd's DaemonSet pod does not
// have (deploy/kubernetes/base/egressd.yaml: BPF, NET_ADMIN, PERFMON only).
func (d *Datapath) learnedPin(idx uint32) string {
	return filepath.Join(d.cfg.PinRoot, "learned", strconv.FormatUint(uint64(idx), 10))
}

// openLearned opens idx's learned map, the one whose id learned_of holds for idx: its
// pin (learnedPin) when that is this map, else by the id (which needs CAP_SYS_ADMIN:
// the pin of a slot made by a build without pins); nil when neither opens it.
func (d *Datapath) openLearned(idx uint32, id bpf.MapID) *bpf.Map {
	if m, err := bpf.LoadPinnedMap(d.learnedPin(idx), nil); err == nil {
		if info, err := m.Info(); err == nil {
			if got, ok := info.ID(); ok && got == id {
				return m
			}
		}
		m.Close()
	}
	if m, err := bpf.NewMapFromID(id); err == nil {
		return m
	}
	return nil
}

// takeSlot returns the slot for a new sandbox and its index: the lowest warm one, or a
// new slot on the lowest free index (slow path). d.sbx's lock is held.
func (d *Datapath) takeSlot() (uint32, *slot, error) {
	best, found := uint32(0), false
	for idx := range d.warm {
		if !found || idx < best {
			best, found = idx, true
		}
	}
	defer d.kickWarmer()
	if found {
		sl := d.warm[best]
		delete(d.warm, best)
		return best, sl, nil
	}
	idx, ok := d.freeIdx()
	if !ok {
		return 0, nil, fmt.Errorf("%w: %d sandboxes attached", datapath.ErrFull, len(d.byIdx))
	}
	sl, err := d.newSlot(idx)
	if err != nil {
		return 0, nil, err
	}
	return idx, sl, nil
}

// releaseSlot empties a detached sandbox's slot and keeps it warm; a slot that cannot
// be emptied is removed from the outer maps. d.sbx's lock is held.
func (d *Datapath) releaseSlot(idx uint32, sl *slot) error {
	if err := errors.Join(clearMap(sl.rules4), clearMap(sl.rules6), clearMap(sl.learned)); err == nil {
		if len(d.warm) < 2*warmSlots {
			d.warm[idx] = sl
			return nil
		}
	}
	sl.close()
	return d.dropSlot(idx)
}

// dropSlot removes idx's inner maps from the outer maps.
func (d *Datapath) dropSlot(idx uint32) error {
	var errs []error
	for _, m := range []*bpf.Map{d.objs.Rules4Of, d.objs.Rules6Of, d.objs.LearnedOf} {
		if err := m.Delete(idx); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(d.learnedPin(idx)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// clearMap deletes every entry of m.
func clearMap(m *bpf.Map) error {
	var keys [][]byte
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// kickWarmer asks the warmer for a round without blocking. d.sbx's lock is held (or d is
// not shared yet).
func (d *Datapath) kickWarmer() {
	if d.sbx.Closed() {
		return
	}
	select {
	case d.warmKick <- struct{}{}:
	default:
	}
}

// warmer keeps warmSlots free slots ready until Close.
func (d *Datapath) warmer() {
	defer close(d.warmDone)
	for range d.warmKick {
		d.sbx.Lock()
		if d.sbx.Closed() {
			d.sbx.Unlock()
			return
		}
		var want []uint32
		for idx := uint32(0); idx < maxSbx && len(d.warm)+len(want) < warmSlots; idx++ {
			_, used := d.byIdx[idx]
			_, warm := d.warm[idx]
			if !used && !warm && !d.warming[idx] {
				want = append(want, idx)
				d.warming[idx] = true
			}
		}
		d.sbx.Unlock()
		slots := make([]*slot, len(want))
		var wg sync.WaitGroup
		for i, idx := range want {
			wg.Go(func() {
				sl, err := d.newSlot(idx)
				if err != nil {
					d.log.Warn("warming a sandbox slot failed", "idx", idx, "err", err)
				}
				slots[i] = sl
			})
		}
		wg.Wait()
		d.sbx.Lock()
		for i, idx := range want {
			delete(d.warming, idx)
			if slots[i] != nil {
				d.warm[idx] = slots[i]
			}
		}
		d.sbx.Unlock()
	}
}
