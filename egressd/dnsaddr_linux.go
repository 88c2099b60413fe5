package egressd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultDNSInterface is the dummy interface that carries Config.LocalDNS.
const DefaultDNSInterface = "airlock-dns"

// DefaultLocalDNS is the node-local DNS address of a Kubernetes node, the address
// NodeLocal DNSCache uses by convention: link-local, so it is the same on every node and
// never routed off it. Pods' dnsConfig names it (lifecycle/kube Config.DNS).
var DefaultLocalDNS = netip.MustParseAddr("169.254.20.10")

// EnsureDNSAddress makes addr (one IPv4 or IPv6 address, as a /32 or /128) a local
// address of this node on the dummy interface ifname, creating the interface when it is
// missing and setting it up. It is idempotent and removes nothing: the interface and
// address stay when egressd stops. Errors: an invalid or unspecified addr, or an existing
// ifname that is not a dummy interface (left as it is).
func EnsureDNSAddress(ifname string, addr netip.Addr) error {
	if !addr.IsValid() || addr.IsUnspecified() || addr.IsMulticast() || addr.Zone() != "" {
		return fmt.Errorf("%w: node-local DNS address %q: want one unicast address", ErrConfig, addr)
	}
	addr = addr.Unmap()
	if ifname == "" || len(ifname) >= 16 {
		return fmt.Errorf("%w: DNS interface name %q: want 1 to 15 bytes", ErrConfig, ifname)
	}
	link, err := netlink.LinkByName(ifname)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: ifname}}
		if err := netlink.LinkAdd(d); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create dummy interface %s: %w", ifname, err)
		}
		if link, err = netlink.LinkByName(ifname); err != nil {
			return fmt.Errorf("dummy interface %s: %w", ifname, err)
		}
	case err != nil:
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	if link.Type() != "dummy" {
		return fmt.Errorf("%w: interface %s exists and is a %s, not a dummy interface", ErrConfig, ifname, link.Type())
	}
	ipn := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}
	// AddrReplace creates the address or leaves an identical one in place.
	a := &netlink.Addr{IPNet: ipn, Scope: int(netlink.SCOPE_UNIVERSE)}
	if addr.Is6() {
		a.Flags = unix.IFA_F_NODAD // bindable at once
	}
	if err := netlink.AddrReplace(link, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", ipn, ifname, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", ifname, err)
	}
	return nil
}
