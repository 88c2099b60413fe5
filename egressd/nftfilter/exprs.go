package nftfilter

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Expression builders for the inet-family ingress chain. Rules that read IPv4 or IPv6
// headers start with nfproto so the offsets are right.

const (
	reg     = unix.NFT_REG_1
	reg2    = unix.NFT_REG_2    // a second value (the port of a NAT)
	regCat  = unix.NFT_REG32_00 // concatenations start here, 4 bytes per field
	nfIPv4  = unix.NFPROTO_IPV4
	nfIPv6  = unix.NFPROTO_IPV6
	protoTC = unix.IPPROTO_TCP
	protoUD = unix.IPPROTO_UDP
)

type fam struct {
	nfproto    byte
	saddrOff   uint32
	daddrOff   uint32
	addrLen    uint32
	icmp       byte
	echoReply  byte
	suffix     string // set name suffix: "4" or "6"
	concatRegs uint32 // registers the address takes in a concatenation
}

func (f fam) addrFromKey(b []byte) netip.Addr {
	if f.addrLen == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16([16]byte(b[:16]))
}

var (
	v4 = fam{nfproto: nfIPv4, saddrOff: 12, daddrOff: 16, addrLen: 4, icmp: unix.IPPROTO_ICMP, echoReply: 0, suffix: "4", concatRegs: 1}
	v6 = fam{nfproto: nfIPv6, saddrOff: 8, daddrOff: 24, addrLen: 16, icmp: unix.IPPROTO_ICMPV6, echoReply: 129, suffix: "6", concatRegs: 4}
)

func nfproto(f fam) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{f.nfproto}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// dport matches the transport destination port in [lo, hi].
func dport(lo, hi uint16) []expr.Any {
	load := &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if lo == hi {
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: be16(lo)}}
	}
	return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: reg, FromData: be16(lo), ToData: be16(hi)}}
}

// daddrIn matches the destination address against a prefix of the family.
func daddrIn(f fam, p netip.Prefix) []expr.Any {
	if p.Bits() == 0 {
		return nil
	}
	addr := p.Addr().AsSlice()
	out := []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen}}
	if p.Bits() < int(f.addrLen*8) {
		mask := make([]byte, f.addrLen)
		for i := 0; i < p.Bits(); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out, &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: f.addrLen, Mask: mask, Xor: make([]byte, f.addrLen)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: addr})
}

// addrInSet matches the source or destination address against a named set.
func addrInSet(f fam, src bool, set string, invert bool) []expr.Any {
	off := f.daddrOff
	if src {
		off = f.saddrOff
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.addrLen},
		&expr.Lookup{SourceRegister: reg, SetName: set, Invert: invert},
	}
}

// flowKey loads daddr . l4proto . dport . sport into the concatenation registers.
func flowKey(f fam) []expr.Any {
	r := uint32(regCat)
	return []expr.Any{
		&expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r + f.concatRegs},
		&expr.Payload{DestRegister: r + f.concatRegs + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Payload{DestRegister: r + f.concatRegs + 2, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
	}
}

// grantKey loads daddr . l4proto . dport into the concatenation registers (the key of
// the port-restricted learned grants).
func grantKey(f fam) []expr.Any {
	return flowKey(f)[:3]
}

// grantElem is the interval element of a learned grant of addr.
func grantElem(addr netip.Addr, g datapath.ProtoPorts, ttl time.Duration) nftables.SetElement {
	lo, hi := g.Ports.Bounds()
	key := func(port uint16) []byte {
		b := append(addr.AsSlice(), byte(g.Proto), 0, 0, 0)
		return append(b, byte(port>>8), byte(port), 0, 0)
	}
	return nftables.SetElement{Key: key(lo), KeyEnd: key(hi), Timeout: ttl}
}

// grantFromElem decodes a grant element of family f.
func grantFromElem(f fam, e nftables.SetElement) (netip.Addr, datapath.ProtoPorts, bool) {
	al := int(f.addrLen)
	if len(e.Key) < al+8 || len(e.KeyEnd) < al+8 {
		return netip.Addr{}, datapath.ProtoPorts{}, false
	}
	lo := uint16(e.Key[al+4])<<8 | uint16(e.Key[al+5])
	hi := uint16(e.KeyEnd[al+4])<<8 | uint16(e.KeyEnd[al+5])
	return f.addrFromKey(e.Key), datapath.ProtoPorts{Proto: datapath.Proto(e.Key[al]), Ports: datapath.PortRange{First: lo, Last: hi}}, true
}

// addFlow records the packet's flow (key already loaded by flowKey).
func addFlow(set string, idle time.Duration) expr.Any {
	return &expr.Dynset{SrcRegKey: regCat, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: idle}
}

func tcpFlags(mask, want byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 1, Mask: []byte{mask}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{want}},
	}
}

func icmpType(lo, hi byte) []expr.Any {
	load := &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1}
	if lo == hi {
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{lo}}}
	}
	return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: reg, FromData: []byte{lo}, ToData: []byte{hi}}}
}

func setMark(mark, mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ^mask), Xor: binary.NativeEndian.AppendUint32(nil, mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg},
	}
}

func counter(name string) expr.Any {
	return &expr.Objref{Type: 1 /* NFT_OBJECT_COUNTER */, Name: name}
}

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(e ...expr.Any) []expr.Any { return e }
