package datapath

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
)

// AttachedSet is the bookkeeping both backends (ebpf.Datapath, nftfilter.Filter) keep
// once, here: the sandboxes a datapath enforces, by id, the lock that guards them
// together with the backend's own tables, whether the datapath is closed, and the
// sequences around the backend's kernel work (the start of Attach, Detach, Attached).
// S is the backend's record of one sandbox. The zero value is an empty, open set.
//
// Methods that take the lock themselves say so (Attached, Detach); every other method
// is called with the lock held (Lock, Unlock).
type AttachedSet[S any] struct {
	mu     sync.Mutex
	byID   map[string]S
	closed bool
}

// Lock takes the set's lock, which is also the backend's: it serialises the backend's
// writes to its kernel tables.
func (a *AttachedSet[S]) Lock() { a.mu.Lock() }

// Unlock releases the lock Lock took.
func (a *AttachedSet[S]) Unlock() { a.mu.Unlock() }

// Attached lists the ids of the set, sorted (Datapath.Attached). It takes the lock.
func (a *AttachedSet[S]) Attached() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.byID))
}

// Lookup returns the sandbox of id and whether there is one.
func (a *AttachedSet[S]) Lookup(id string) (S, bool) {
	s, ok := a.byID[id]
	return s, ok
}

// Get returns the sandbox of id, or an error wrapping ErrUnknownSandbox.
func (a *AttachedSet[S]) Get(id string) (S, error) {
	s, ok := a.byID[id]
	if !ok {
		return s, fmt.Errorf("%w: %s", ErrUnknownSandbox, id)
	}
	return s, nil
}

// Add records s as the sandbox of id, replacing any.
func (a *AttachedSet[S]) Add(id string, s S) {
	if a.byID == nil {
		a.byID = map[string]S{}
	}
	a.byID[id] = s
}

// Remove forgets the sandbox of id; an unknown id is not an error.
func (a *AttachedSet[S]) Remove(id string) { delete(a.byID, id) }

// All iterates over the set's ids and sandboxes, in no particular order. The set must
// not change during the iteration.
func (a *AttachedSet[S]) All() iter.Seq2[string, S] { return maps.All(a.byID) }

// Len returns how many sandboxes the set holds.
func (a *AttachedSet[S]) Len() int { return len(a.byID) }

// Closed reports whether Close marked the set closed.
func (a *AttachedSet[S]) Closed() bool { return a.closed }

// Close marks the set closed (Claim fails from then on) and reports whether it was
// open: a backend's Close releases its handles only the first time.
func (a *AttachedSet[S]) Close() bool {
	open := !a.closed
	a.closed = true
	return open
}

// Claim is the start of every backend's Attach of spec, after ValidateSpec: it fails
// with ErrUnavailable once the set is closed and with ErrInvalidSpec when spec's host
// interface belongs to another sandbox; a sandbox of spec.ID hooked on another
// interface (the sandbox was recreated) is torn down first, as by Detach. It returns
// the sandbox of spec.ID hooked on spec's interface (attached earlier or adopted from
// a previous process: the backend updates it in place), if any.
//
// onInterface reports whether a sandbox is hooked on spec's interface, by what the
// backend reads back after an adoption (the eBPF backend compares the ifindex, the
// nftables backend the name); teardown is as for Detach.
func (a *AttachedSet[S]) Claim(spec Spec, onInterface func(S) bool, teardown func(S) error) (S, bool, error) {
	var none S
	if a.closed {
		return none, false, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	for id, o := range a.byID {
		if id != spec.ID && onInterface(o) {
			return none, false, fmt.Errorf("%w: interface %s (index %d) already belongs to sandbox %s",
				ErrInvalidSpec, spec.HostIfname, spec.HostIfindex, id)
		}
	}
	s, ok := a.byID[spec.ID]
	if !ok {
		return none, false, nil
	}
	if onInterface(s) {
		return s, true, nil
	}
	if err := a.teardown(spec.ID, s, teardown); err != nil {
		return none, false, err
	}
	return none, false, nil
}

// Detach is every backend's Detach (Datapath.Detach): under the lock, the sandbox of
// id (an error wrapping ErrUnknownSandbox when there is none) is torn down by teardown,
// the backend's removal of its hooks, table entries, rules and sets. The sandbox leaves
// the set when teardown succeeds; when it fails the sandbox stays, so that a retry can
// finish the job, unless teardown removed it (Remove) because nothing is left to retry.
func (a *AttachedSet[S]) Detach(id string, teardown func(S) error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, err := a.Get(id)
	if err != nil {
		return err
	}
	return a.teardown(id, s, teardown)
}

func (a *AttachedSet[S]) teardown(id string, s S, teardown func(S) error) error {
	if err := teardown(s); err != nil {
		return err
	}
	delete(a.byID, id)
	return nil
}
