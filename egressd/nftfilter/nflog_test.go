package nftfilter

import (
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/airlockdev/airlock/egressd/datapath"
)

func TestParseNflog(t *testing.T) {
	pkt := make([]byte, 40)
	pkt[0] = 0x45
	pkt[9] = 6
	copy(pkt[12:], []byte{10, 77, 0, 2})
	copy(pkt[16:], []byte{198, 18, 3, 1})
	pkt[20], pkt[21], pkt[22], pkt[23] = 0x9c, 0x40, 0, 80
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nfulaPayload, pkt)
	ae.String(nfulaPrefix, logPrefix(datapath.KindDrop, datapath.ReasonDefaultDeny, 0, "sbx-1"))
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := parseNflog(b)
	if !ok {
		t.Fatal("not parsed")
	}
	if ev.Sandbox != "sbx-1" || ev.Kind != datapath.KindDrop || ev.Reason != datapath.ReasonDefaultDeny ||
		ev.Proto != datapath.ProtoTCP || ev.Src != netip.MustParseAddrPort("10.77.0.2:40000") || ev.Dst != netip.MustParseAddrPort("198.18.3.1:80") {
		t.Fatalf("event %v", ev)
	}
	if _, ok := parseNflog(nil); ok {
		t.Fatal("empty message parsed")
	}
}
