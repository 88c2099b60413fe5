package enforcer

import (
	"sync"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// lazyAttribution is the nftables fallback's process attribution in auto mode: the
// recording-only socket programs (openAttribution) load when the first sandbox falls
// back to nftables, not at start, since with eBPF working no sandbox may ever need
// them. A load that fails is logged once (openAttribution) and not tried again: the
// fallback's flows then name no process.
type lazyAttribution struct {
	open func() datapath.Attributor

	mu     sync.Mutex
	tried  bool
	a      datapath.Attributor
	closed bool
}

// get returns the attributor, loading it on the first call (nil when it did not load).
func (l *lazyAttribution) get(load bool) datapath.Attributor {
	l.mu.Lock()
	defer l.mu.Unlock()
	if load && !l.tried && !l.closed {
		l.tried = true
		l.a = l.open()
	}
	return l.a
}

// Watch implements datapath.Attributor, loading the programs on the first call.
func (l *lazyAttribution) Watch(spec datapath.Spec) error {
	if spec.Cgroup == "" {
		return nil
	}
	if a := l.get(true); a != nil {
		return a.Watch(spec)
	}
	return nil
}

// Unwatch implements datapath.Attributor.
func (l *lazyAttribution) Unwatch(id string) error {
	if a := l.get(false); a != nil {
		return a.Unwatch(id)
	}
	return nil
}

// Process implements datapath.Attributor.
func (l *lazyAttribution) Process(e datapath.Event) *datapath.Process {
	if a := l.get(false); a != nil {
		return a.Process(e)
	}
	return nil
}

// Close implements datapath.Attributor: the programs, when loaded, are unloaded.
func (l *lazyAttribution) Close() error {
	l.mu.Lock()
	a := l.a
	l.a, l.closed = nil, true
	l.mu.Unlock()
	if a != nil {
		return a.Close()
	}
	return nil
}

var _ datapath.Attributor = (*lazyAttribution)(nil)
