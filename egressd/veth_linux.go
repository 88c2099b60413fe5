package egressd

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airlockdev/airlock/lifecycle/watch"
)

// sandboxVeth finds the host side of a sandbox's veth: the runtime's HostInterface when
// it knows it, else from the sandbox's process (hostVeth), else, for a pod, from the
// route to its address (podVeth).
func sandboxVeth(rt watch.Runtime, addr netip.Addr) (int, string, error) {
	if rt.HostInterface == "" && rt.Pid <= 0 && rt.Kind == RuntimeKubernetes {
		return podVeth(addr)
	}
	return hostVeth(rt.Pid, rt.HostInterface)
}

// hostVeth finds the host side of a sandbox's veth: the sandbox's eth0 (in the network
// namespace of pid) names its peer's interface index in IFLA_LINK, which is an index in
// the host namespace. ifname, when the runtime knows it, is checked and preferred.
func hostVeth(pid int, ifname string) (int, string, error) {
	if ifname != "" {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return 0, "", fmt.Errorf("host interface %s: %w", ifname, err)
		}
		return l.Attrs().Index, ifname, nil
	}
	if pid <= 0 {
		return 0, "", fmt.Errorf("no process id to find the sandbox's network namespace")
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return 0, "", fmt.Errorf("network namespace of pid %d: %w", pid, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, "", fmt.Errorf("netlink in pid %d's namespace: %w", pid, err)
	}
	defer h.Close()
	inner, err := h.LinkByName("eth0")
	if err != nil {
		return 0, "", fmt.Errorf("eth0 of pid %d: %w", pid, err)
	}
	peer := inner.Attrs().ParentIndex
	if peer <= 0 {
		return 0, "", fmt.Errorf("eth0 of pid %d is not a veth (no peer index)", pid)
	}
	l, err := netlink.LinkByIndex(peer)
	if err != nil {
		return 0, "", fmt.Errorf("host side of pid %d's veth (index %d): %w", pid, peer, err)
	}
	return peer, l.Attrs().Name, nil
}
