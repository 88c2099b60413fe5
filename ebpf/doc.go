// Package egressbpf is Airlock's eBPF egress datapath: TC programs (TCX where the kernel
// has it, clsact otherwise) on the host side of each sandbox's veth, with per-sandbox
// inner maps (static LPM rules, learned addresses with expiry checked in the program),
// a shared flow table, a ring buffer of events, and everything pinned under a bpffs root
// (/sys/fs/bpf/airlock by default) so enforcement outlives the process.
//
// The package is named egressbpf (not ebpf) so it never shadows github.com/cilium/ebpf.
// It implements egressd/datapath.Datapath; README.md describes programs, maps, the pin
// layout, events and metrics. The C source is airlock.c; `make generate` rebuilds
// airlock_bpfel.o and its bindings with bpf2go.
package egressbpf
