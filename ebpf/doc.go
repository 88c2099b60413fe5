// Package ebpf is Airlock's eBPF egress datapath: TC programs (TCX where the kernel
// has it, clsact otherwise) on the host side of each sandbox's veth, with per-sandbox
// inner maps (static LPM rules, learned addresses with expiry checked in the program),
// a shared flow table, a ring buffer of events, and everything pinned under a bpffs root
// (/sys/fs/bpf/airlock by default) so enforcement outlives the process.
//
// The package is named after its folder, so importers need no alias; inside it,
// github.com/cilium/ebpf is imported as bpf (the generated airlock_bpfel.go imports it
// unaliased, which Go allows). It implements egressd/datapath.Datapath and depends on
// egressd only through that contract: egressd never imports this package, the
// composition root (cmd/airlock, internal/up) hands a Config to egressd/enforcer as its
// eBPF backend (Config.Open). README.md describes programs, maps, the pin layout,
// events and metrics. The C source is airlock.c; `make generate` rebuilds
// airlock_bpfel.o and its bindings with bpf2go.
package ebpf
