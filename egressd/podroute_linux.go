package egressd

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RuntimeKubernetes is watch.Runtime.Kind for sandboxes that are pods. A pod has no
// process egressd can see (Runtime.Pid is 0) and no known host interface: its host-side
// veth is found from the route to its address (podVeth).
const RuntimeKubernetes = "kubernetes"

// ErrPodRoute wraps every reason podVeth refuses a pod address: no host route through a
// veth of this node (yet), or a route through a bridge, a gateway or the default route.
var ErrPodRoute = errors.New("no host route to the pod through its own veth")

// podVeth finds the host side of a pod's veth from the kernel's route to the pod's
// address: routed CNIs (Calico, the CNI ptp plugin) install a host route (/32, /128)
// to each pod through the pod's own host-side veth. The matched FIB entry
// (RTM_F_FIB_MATCH, kernel ≥ 4.13) must be a unicast host route without a gateway whose
// output link is a veth. Anything else is refused with ErrPodRoute:
//   - the default route or a wider prefix (the route is not there yet, or the pod is not
//     on this node): attaching to the uplink would filter the node's own traffic;
//   - a route via a gateway (a pod of another node, e.g. flannel host-gw);
//   - a route through a bridge (bridge CNIs): the bridge carries every pod, not one.
//
// podVeth performs netlink I/O in the caller's network namespace only.
func podVeth(addr netip.Addr) (int, string, error) {
	if !addr.IsValid() {
		return 0, "", fmt.Errorf("%w: the pod has no address", ErrPodRoute)
	}
	addr = addr.Unmap()
	routes, err := netlink.RouteGetWithOptions(addr.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
	if err != nil {
		return 0, "", fmt.Errorf("%w: route to %s: %v", ErrPodRoute, addr, err)
	}
	if len(routes) == 0 {
		return 0, "", fmt.Errorf("%w: no route to %s", ErrPodRoute, addr)
	}
	r := routes[0]
	switch {
	case r.Type != unix.RTN_UNICAST:
		return 0, "", fmt.Errorf("%w: %s is not routed to a pod (route type %d)", ErrPodRoute, addr, r.Type)
	case r.Dst == nil:
		return 0, "", fmt.Errorf("%w: %s follows the default route", ErrPodRoute, addr)
	case len(r.MultiPath) > 0 || r.LinkIndex <= 0:
		return 0, "", fmt.Errorf("%w: %s has a multipath route", ErrPodRoute, addr)
	}
	l, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return 0, "", fmt.Errorf("%w: output link %d of the route to %s: %v", ErrPodRoute, r.LinkIndex, addr, err)
	}
	name := l.Attrs().Name
	ones, bits := r.Dst.Mask.Size()
	switch {
	case l.Type() == "bridge":
		return 0, "", fmt.Errorf("%w: %s is routed through bridge %s; egressd needs a routed CNI (one veth per pod, e.g. Calico or ptp)", ErrPodRoute, addr, name)
	case r.Gw != nil:
		return 0, "", fmt.Errorf("%w: %s is routed via gateway %s on %s (a pod of another node?)", ErrPodRoute, addr, r.Gw, name)
	case ones != bits:
		return 0, "", fmt.Errorf("%w: %s matches %s on %s, not a host route", ErrPodRoute, addr, r.Dst, name)
	case l.Type() != "veth":
		return 0, "", fmt.Errorf("%w: %s is routed through %s, a %s, not a veth", ErrPodRoute, addr, name, l.Type())
	}
	return r.LinkIndex, name, nil
}
