package egressd

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// HostResolvers reads the nameservers of /etc/resolv.conf as "addr:53".
func HostResolvers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no nameserver in %s; set egress.upstreams", path)
	}
	return out, sc.Err()
}

// HostAddrs lists this host's interface addresses (the overlay denies them: a sandbox
// must not reach the host's services, the control plane included).
func HostAddrs() []netip.Addr {
	var out []netip.Addr
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range ifs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Addr())
		}
	}
	return out
}
