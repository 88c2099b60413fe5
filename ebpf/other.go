//go:build !linux

package ebpf

import (
	"fmt"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Datapath is only implemented on Linux.
type Datapath struct{ datapath.Datapath }

// New returns datapath.ErrUnavailable outside Linux.
func New(cfg Config) (*Datapath, error) {
	return nil, fmt.Errorf("%w: eBPF needs Linux", datapath.ErrUnavailable)
}

// pinnedSandboxes is 0 outside Linux.
func pinnedSandboxes(string) int { return 0 }
