package egressd

import (
	"testing"

	"github.com/cilium/ebpf/link"
)

// cgroupLinks counts the host's eBPF links of cgroup type (the socket programs of both
// datapaths: pinned per sandbox for eBPF, held by egressd for the nftables datapath's
// process attribution).
func cgroupLinks(t *testing.T) int {
	t.Helper()
	it := new(link.Iterator)
	defer it.Close()
	n := 0
	for it.Next() {
		if info, err := it.Link.Info(); err == nil && info.Type == link.CgroupType {
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("list links: %v", err)
	}
	return n
}
