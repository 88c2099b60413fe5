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
// address of this node on the interface ifname, creating the interface when it is
// missing and setting it up: a dummy interface, or, on kernels built without the dummy
// driver (CONFIG_DUMMY off, as in some minimal VM kernels), a bridge without ports,
// which is as inert. It is idempotent and removes nothing: the interface and address
// stay when egressd stops. Errors: an invalid or unspecified addr, or an existing ifname
// that is neither a dummy nor a bridge without ports (left as it is).
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
		attrs := netlink.LinkAttrs{Name: ifname}
		err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
		if errors.Is(err, unix.EOPNOTSUPP) {
			err = netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create interface %s: %w", ifname, err)
		}
		if link, err = netlink.LinkByName(ifname); err != nil {
			return fmt.Errorf("interface %s: %w", ifname, err)
		}
	case err != nil:
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	switch link.Type() {
	case "dummy":
	case "bridge":
		if err := noPorts(link); err != nil {
			return err
		}
	default:
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

// noPorts refuses a bridge that has ports: it is a real bridge, not a DNS address holder.
func noPorts(br netlink.Link) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			return fmt.Errorf("%w: interface %s exists and is a bridge with ports (%s), not a dummy interface",
				ErrConfig, br.Attrs().Name, l.Attrs().Name)
		}
	}
	return nil
}
