package policies

import (
	"net/netip"
)

// AddrClass is the class of a destination address as far as egress is concerned.
// Everything but ClassPublic is "special": a sandbox reaches it only through an explicit
// IP/CIDR allow rule, never through a catch-all, the default action or a name's answer.
// This closes DNS rebinding into the host's networks.
type AddrClass string

// Address classes.
const (
	ClassPublic      AddrClass = "public"
	ClassPrivate     AddrClass = "private"     // RFC 1918, IPv6 ULA fc00::/7, site-local fec0::/10
	ClassCGNAT       AddrClass = "cgnat"       // 100.64.0.0/10 (RFC 6598)
	ClassLoopback    AddrClass = "loopback"    // 127.0.0.0/8, ::1
	ClassLinkLocal   AddrClass = "link-local"  // 169.254.0.0/16, fe80::/10 (cloud metadata lives here)
	ClassUnspecified AddrClass = "unspecified" // 0.0.0.0/8, ::
	ClassMulticast   AddrClass = "multicast"   // 224.0.0.0/4, ff00::/8
	ClassReserved    AddrClass = "reserved"    // 240.0.0.0/4, 192.0.0.0/24, 198.18.0.0/15, ::/96, 100::/64
	ClassIPv4Mapped  AddrClass = "ipv4-mapped" // ::ffff:0:0/96
	// ClassEmbedded is a NAT64 (64:ff9b::/96, 64:ff9b:1::/48) or 6to4 (2002::/16) address
	// whose embedded IPv4 address is itself special.
	ClassEmbedded AddrClass = "embedded-special"
)

// Special reports whether the class needs an explicit rule.
func (c AddrClass) Special() bool { return c != ClassPublic }

type classPrefix struct {
	p netip.Prefix
	c AddrClass
}

var v4Classes = []classPrefix{
	{netip.MustParsePrefix("0.0.0.0/8"), ClassUnspecified},
	{netip.MustParsePrefix("10.0.0.0/8"), ClassPrivate},
	{netip.MustParsePrefix("100.64.0.0/10"), ClassCGNAT},
	{netip.MustParsePrefix("127.0.0.0/8"), ClassLoopback},
	{netip.MustParsePrefix("169.254.0.0/16"), ClassLinkLocal},
	{netip.MustParsePrefix("172.16.0.0/12"), ClassPrivate},
	{netip.MustParsePrefix("192.0.0.0/24"), ClassReserved},
	{netip.MustParsePrefix("192.168.0.0/16"), ClassPrivate},
	{netip.MustParsePrefix("198.18.0.0/15"), ClassReserved},
	{netip.MustParsePrefix("224.0.0.0/4"), ClassMulticast},
	{netip.MustParsePrefix("240.0.0.0/4"), ClassReserved},
}

var v6Classes = []classPrefix{
	{netip.MustParsePrefix("::/128"), ClassUnspecified},
	{netip.MustParsePrefix("::1/128"), ClassLoopback},
	{netip.MustParsePrefix("::ffff:0:0/96"), ClassIPv4Mapped},
	{netip.MustParsePrefix("::/96"), ClassReserved},
	{netip.MustParsePrefix("100::/64"), ClassReserved},
	{netip.MustParsePrefix("fc00::/7"), ClassPrivate},
	{netip.MustParsePrefix("fe80::/10"), ClassLinkLocal},
	{netip.MustParsePrefix("fec0::/10"), ClassPrivate},
	{netip.MustParsePrefix("ff00::/8"), ClassMulticast},
}

var (
	nat64WK    = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour  = netip.MustParsePrefix("2002::/16")
)

// SpecialPrefixes returns the prefixes whose addresses are special (see AddrClass), for
// datapaths that must refuse them unless an explicit rule allows them. NAT64 and 6to4
// prefixes are listed whole: an embedded public address through them is rare enough.
func SpecialPrefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(v4Classes)+len(v6Classes)+3)
	for _, c := range v4Classes {
		out = append(out, c.p)
	}
	for _, c := range v6Classes {
		out = append(out, c.p)
	}
	return append(out, nat64WK, nat64Local, sixToFour)
}

// Classify returns a's class. An invalid address is ClassUnspecified.
func Classify(a netip.Addr) AddrClass {
	if !a.IsValid() {
		return ClassUnspecified
	}
	a = a.WithZone("")
	if a.Is4() {
		for _, c := range v4Classes {
			if c.p.Contains(a) {
				return c.c
			}
		}
		if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return ClassReserved
		}
		return ClassPublic
	}
	for _, c := range v6Classes {
		if c.p.Contains(a) {
			return c.c
		}
	}
	b := a.As16()
	var embedded netip.Addr
	switch {
	case nat64WK.Contains(a), nat64Local.Contains(a):
		embedded = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	case sixToFour.Contains(a):
		embedded = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
	}
	if embedded.IsValid() && Classify(embedded).Special() {
		return ClassEmbedded
	}
	return ClassPublic
}
