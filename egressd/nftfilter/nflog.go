package nftfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// NFLOG over nfnetlink (include/uapi/linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG   = 4
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
	nfulaPrefix      = 10
	snapLen          = 128 // enough for IPv6 + extension-free L4 ports
)

// nflogReader receives the log expressions' packets of one NFLOG group and turns
// their "al ..." prefixes into events.
type nflogReader struct {
	conn    *netlink.Conn
	deliver func(datapath.Event)
	lost    atomic.Uint64
	closing atomic.Bool
	done    chan struct{}
}

func newNflogReader(netnsPath string, group uint16, deliver func(datapath.Event)) (*nflogReader, error) {
	cfg := &netlink.Config{}
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("nflog socket: %w", err)
	}
	hdr := func(attrs []byte) []byte {
		b := []byte{unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, 0, 0}
		binary.BigEndian.PutUint16(b[2:], group)
		return append(b, attrs...)
	}
	send := func(attr uint16, data []byte) error {
		ae := netlink.NewAttributeEncoder()
		ae.Bytes(attr, data)
		ab, err := ae.Encode()
		if err != nil {
			return err
		}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   hdr(ab),
		})
		return err
	}
	if err := send(nfulaCfgCmd, []byte{nfulnlCfgCmdBind}); err != nil {
		c.Close()
		return nil, fmt.Errorf("nflog bind group %d: %w", group, err)
	}
	mode := binary.BigEndian.AppendUint32(nil, snapLen)
	mode = append(mode, nfulnlCopyPacket, 0)
	if err := send(nfulaCfgMode, mode); err != nil {
		c.Close()
		return nil, fmt.Errorf("nflog copy mode: %w", err)
	}
	r := &nflogReader{conn: c, deliver: deliver, done: make(chan struct{})}
	go r.run()
	return r, nil
}

func (r *nflogReader) run() {
	defer close(r.done)
	for {
		msgs, err := r.conn.Receive()
		if err != nil {
			if r.closing.Load() {
				return
			}
			if errors.Is(err, unix.ENOBUFS) {
				// The socket buffer overflowed: the kernel dropped log messages.
				r.lost.Add(1)
				continue
			}
			// Anything else is unexpected; back off so that a persistent error
			// cannot spin a core.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, m := range msgs {
			if m.Header.Type&0xff != nfulnlMsgPacket || len(m.Data) < 4 {
				continue
			}
			if ev, ok := parseNflog(m.Data[4:]); ok {
				r.deliver(ev)
			}
		}
	}
}

// Close stops the reader.
func (r *nflogReader) Close() error {
	r.closing.Store(true)
	err := r.conn.Close()
	<-r.done
	return err
}

func parseNflog(attrs []byte) (datapath.Event, bool) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return datapath.Event{}, false
	}
	var prefix string
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			prefix = strings.TrimRight(ad.String(), "\x00")
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	// "al <kind> <reason> <rule> <id>"
	parts := strings.SplitN(prefix, " ", 5)
	if len(parts) != 5 || parts[0] != "al" {
		return datapath.Event{}, false
	}
	kind, _ := strconv.Atoi(parts[1])
	reason, _ := strconv.Atoi(parts[2])
	rule, _ := strconv.Atoi(parts[3])
	ev := datapath.Event{Time: time.Now(), Sandbox: parts[4], Kind: datapath.Kind(kind), Reason: datapath.Reason(reason), Rule: uint16(rule)}
	parsePacket(payload, &ev)
	return ev, true
}

// parsePacket fills addresses, protocol and ports from an IP packet.
func parsePacket(b []byte, ev *datapath.Event) {
	if len(b) < 20 {
		return
	}
	var src, dst netip.Addr
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		ev.Proto = datapath.Proto(b[9])
		src, dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		if len(b) >= ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return
		}
		ev.Proto = datapath.Proto(b[6])
		src, dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		l4 = b[40:]
	default:
		return
	}
	var sp, dp uint16
	if (ev.Proto == datapath.ProtoTCP || ev.Proto == datapath.ProtoUDP) && len(l4) >= 4 {
		sp, dp = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
	}
	ev.Src, ev.Dst = netip.AddrPortFrom(src, sp), netip.AddrPortFrom(dst, dp)
}
