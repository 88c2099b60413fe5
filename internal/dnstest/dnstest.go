// Package dnstest starts the fake upstream resolvers tests forward to: miekg/dns
// servers on loopback UDP, stopped when the test ends. Test traffic never leaves the
// machine.
package dnstest

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// Serve answers UDP queries on a loopback port with h until the test ends and returns
// the server's "127.0.0.1:port".
func Serve(t testing.TB, h dns.HandlerFunc) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// Zone answers A queries for the names of zone (fully qualified, lower case; queries
// match in any case) with their address and ttl (seconds), other types of those
// names with no records, and every other name NXDOMAIN.
func Zone(zone map[string]netip.Addr, ttl uint32) dns.HandlerFunc {
	return func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		a, ok := zone[strings.ToLower(q.Question[0].Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA && a.Is4():
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA,
				Class: dns.ClassINET, Ttl: ttl}, A: a.AsSlice()}}
		case q.Question[0].Qtype == dns.TypeAAAA && a.Is6():
			m.Answer = []dns.RR{&dns.AAAA{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeAAAA,
				Class: dns.ClassINET, Ttl: ttl}, AAAA: a.AsSlice()}}
		}
		w.WriteMsg(m)
	}
}
