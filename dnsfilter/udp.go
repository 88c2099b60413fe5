package dnsfilter

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/airlockdev/airlock/policies"
)

// UDP serving. miekg/dns's server starts a goroutine per UDP query, whose stack grows
// twice (2 KiB → 8 KiB, copied each time) while the query is parsed and checked: about
// a tenth of the CPU of an answer from the cache. The filter reads UDP itself instead,
// with a fixed set of long-lived readers: a reader answers a query whose answer is
// cached in place, and hands every other query (it may wait for an upstream) to a
// goroutine of its own, so that a slow upstream never holds up reading. Parsing and
// packing remain miekg/dns's (Msg.Unpack, Msg.PackBuffer), and a query is accepted or
// rejected exactly as miekg/dns's server does it (DefaultMsgAcceptFunc), which still
// serves TCP.

// udpBufSize is the largest query read (miekg/dns's server reads as much,
// dns.DefaultMsgSize).
const udpBufSize = dns.DefaultMsgSize

// udpReaders is how many readers share the UDP socket: one reads while the others
// answer.
func udpReaders() int { return max(4, 2*runtime.GOMAXPROCS(0)) }

// serveUDP reads and answers UDP queries until the socket is closed.
func (s *Server) serveUDP() error {
	conn := s.udp.(*net.UDPConn)
	// A listener on the unspecified address must answer from the address each query
	// was sent to: the readers then use miekg/dns's session functions, which carry it in
	// a control message.
	wildcard := s.Addr().Addr().IsUnspecified()
	if wildcard {
		err6 := ipv6.NewPacketConn(conn).SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true)
		err4 := ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true)
		if err4 != nil && err6 != nil {
			return err4
		}
	}
	n := udpReaders()
	errc := make(chan error, n)
	for range n {
		s.inflight.Add(1)
		go func() {
			defer s.inflight.Done()
			errc <- s.readUDP(conn, wildcard)
		}()
	}
	var err error
	for range n {
		if e := <-errc; e != nil && err == nil {
			err = e
			conn.Close() // stop the other readers too
		}
	}
	return err
}

// readUDP is one reader's loop.
func (s *Server) readUDP(conn *net.UDPConn, wildcard bool) error {
	buf := make([]byte, udpBufSize)
	// w answers the queries this reader answers in place; its pack buffer is reused.
	w := &udpWriter{conn: conn, buf: make([]byte, udpBufSize)}
	for {
		var (
			n       int
			from    netip.AddrPort
			session *dns.SessionUDP
			err     error
		)
		if wildcard {
			n, session, err = dns.ReadFromSessionUDP(conn, buf)
			if err == nil {
				from = session.RemoteAddr().(*net.UDPAddr).AddrPort()
			}
		} else {
			n, from, err = conn.ReadFromUDPAddrPort(buf)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Debug("dns udp read failed", "err", err)
			if s.closing() {
				return nil
			}
			time.Sleep(time.Millisecond) // a persistent error must not spin
			continue
		}
		req, reject := parseQuery(buf[:n])
		if req == nil {
			continue // not a query (or no header): answering could be used to amplify
		}
		if reject != nil {
			s.reply(w.reset(from, session), reject)
			continue
		}
		if s.answerCached(req) {
			s.ServeDNS(w.reset(from, session), req)
			continue
		}
		s.handOff(udpQuery{w: (&udpWriter{conn: conn}).reset(from, session), req: req})
	}
}

// udpQuery is a query handed off by a reader.
type udpQuery struct {
	w   *udpWriter
	req *dns.Msg
}

// maxIdleWorkers bounds the goroutines kept waiting for handed-off queries.
const maxIdleWorkers = 64

// handOff answers q on another goroutine: an idle worker (its stack already grown) or,
// when none is idle, a new one, which then stays for more while fewer than
// maxIdleWorkers wait.
func (s *Server) handOff(q udpQuery) {
	select {
	case s.work <- q:
		return
	default:
	}
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		s.ServeDNS(q.w, q.req)
		for {
			if s.idleWorkers.Add(1) > maxIdleWorkers {
				s.idleWorkers.Add(-1)
				return
			}
			select {
			case q = <-s.work:
				s.idleWorkers.Add(-1)
				s.ServeDNS(q.w, q.req)
			case <-s.done:
				s.idleWorkers.Add(-1)
				return
			}
		}
	}()
}

// answerCached reports whether req's answer is in the cache, so that answering it
// waits for nothing.
func (s *Server) answerCached(req *dns.Msg) bool {
	if len(req.Question) != 1 {
		return true // refused without an upstream
	}
	q := req.Question[0]
	return s.cache.has(cacheKey{policies.NormalizeName(q.Name), q.Qtype}, time.Now())
}

// reply writes m, logging a failure.
func (s *Server) reply(w dns.ResponseWriter, m *dns.Msg) {
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("dns write failed", "err", err)
	}
}

// parseQuery unpacks b, accepting or rejecting it as dns.DefaultMsgAcceptFunc does:
// req is nil for a message that gets no answer (a response, or shorter than a header);
// reject is the answer to a query refused before the handler (FORMERR, NOTIMP).
func parseQuery(b []byte) (req, reject *dns.Msg) {
	if len(b) < 12 {
		return nil, nil
	}
	h := dns.Header{
		Id: binary.BigEndian.Uint16(b), Bits: binary.BigEndian.Uint16(b[2:]),
		Qdcount: binary.BigEndian.Uint16(b[4:]), Ancount: binary.BigEndian.Uint16(b[6:]),
		Nscount: binary.BigEndian.Uint16(b[8:]), Arcount: binary.BigEndian.Uint16(b[10:]),
	}
	action := dns.DefaultMsgAcceptFunc(h)
	if action == dns.MsgIgnore {
		return nil, nil
	}
	req = new(dns.Msg)
	if action == dns.MsgAccept {
		if err := req.Unpack(b); err == nil {
			return req, nil
		}
	}
	// The answer carries the query's header only (as miekg/dns's server answers).
	m := new(dns.Msg)
	m.Id = h.Id
	m.Response = true
	m.Opcode = int(h.Bits>>11) & 0xF
	m.RecursionDesired = h.Bits&(1<<8) != 0
	m.CheckingDisabled = h.Bits&(1<<4) != 0
	m.Rcode = dns.RcodeFormatError
	if action == dns.MsgRejectNotImplemented {
		m.Rcode = dns.RcodeNotImplemented
	}
	return req, m
}

// udpWriter is the dns.ResponseWriter of a UDP query.
type udpWriter struct {
	conn    *net.UDPConn
	remote  netip.AddrPort
	session *dns.SessionUDP // set on a wildcard listener
	buf     []byte          // pack buffer; nil allocates one per answer
}

func (w *udpWriter) reset(remote netip.AddrPort, session *dns.SessionUDP) *udpWriter {
	w.remote, w.session = remote, session
	return w
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.conn.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.remote) }

func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.PackBuffer(w.buf)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (w *udpWriter) Write(b []byte) (int, error) {
	if w.session != nil {
		return dns.WriteToSessionUDP(w.conn, b, w.session)
	}
	return w.conn.WriteToUDPAddrPort(b, w.remote)
}

func (w *udpWriter) Close() error        { return nil }
func (w *udpWriter) TsigStatus() error   { return nil }
func (w *udpWriter) TsigTimersOnly(bool) {}
func (w *udpWriter) Hijack()             {}
