// Package ebpftest hands the eBPF backend (package ebpf) to the tests of egressd and
// egressd/enforcer. No package under egressd/ imports ebpf/, test packages included
// (internal/archtest checks it): the in-package tests there are written against
// enforcer.EBPF, and their external test packages, the composition roots of the test
// binaries (nothing imports them), set it from here, as cmd/airlock and internal/up
// hand ebpf.Config to egressd in production.
package ebpftest

import (
	"github.com/airlockdev/airlock/ebpf"
	"github.com/airlockdev/airlock/egressd/enforcer"
)

// Backend returns the eBPF backend whose state is pinned under pinRoot (a bpffs
// directory of the test's own), for enforcer.Config.EBPF.
func Backend(pinRoot string) enforcer.EBPF { return ebpf.Config{PinRoot: pinRoot} }

// BackendNoAttribution is Backend with process attribution off
// (ebpf.Config.NoAttribution), for the attribution on/off bench.
func BackendNoAttribution(pinRoot string) enforcer.EBPF {
	return ebpf.Config{PinRoot: pinRoot, NoAttribution: true}
}

// BackendTaskReads is Backend with the socket programs reading the calling task field
// by field (ebpf.Config.TaskReads), the fallback of kernels whose socket programs may
// not call bpf_get_current_task_btf.
func BackendTaskReads(pinRoot string) enforcer.EBPF {
	return ebpf.Config{PinRoot: pinRoot, TaskReads: true}
}
