package enforcer_test

import (
	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/internal/ebpftest"
)

// This external test package is the composition root of the test binary: it hands the
// in-package tests the eBPF backend, which no package under egressd/ imports.
func init() {
	enforcer.EBPFBackend = ebpftest.Backend
	enforcer.EBPFBackendNoAttribution = ebpftest.BackendNoAttribution
	enforcer.EBPFBackendTaskReads = ebpftest.BackendTaskReads
}
