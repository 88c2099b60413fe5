package dnsfilter

import (
	"encoding/binary"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// rawAnswer sends b over UDP to the filter and returns the answer, or nil when none
// came within wait.
func rawAnswer(t *testing.T, h *harness, b []byte, wait time.Duration) *dns.Msg {
	t.Helper()
	c, err := net.Dial("udp", h.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

// The UDP readers accept and reject messages as miekg/dns's server does (it serves TCP).
func TestUDPAcceptsAsMiekgServer(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	q := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA)
	q.Id = 4242
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// a response is never answered (reflection), nor is a message shorter than a header
	resp := q.Copy()
	resp.Response = true
	if m := rawAnswer(t, h, pack(resp), 300*time.Millisecond); m != nil {
		t.Errorf("a response was answered: %v", m)
	}
	if m := rawAnswer(t, h, []byte{1, 2, 3}, 300*time.Millisecond); m != nil {
		t.Errorf("a short message was answered: %v", m)
	}
	// two questions: FORMERR; an UPDATE: NOTIMP; a body that does not parse: FORMERR
	two := pack(q)
	binary.BigEndian.PutUint16(two[4:], 2)
	update := q.Copy()
	update.Opcode = dns.OpcodeUpdate
	cut := pack(q)
	cut = cut[:len(cut)-3]
	for name, c := range map[string]struct {
		b     []byte
		rcode int
	}{"two questions": {two, dns.RcodeFormatError}, "update": {pack(update), dns.RcodeNotImplemented}, "cut": {cut, dns.RcodeFormatError}} {
		m := rawAnswer(t, h, c.b, 5*time.Second)
		if m == nil || m.Id != 4242 || !m.Response || m.Rcode != c.rcode {
			t.Errorf("%s: answer %v, want %s with the query's id", name, m, dns.RcodeToString[c.rcode])
		}
	}
	if h.up.total("allowed.example.com") != 0 {
		t.Error("a rejected message reached the upstream")
	}
	// and a well-formed query is answered
	if m := rawAnswer(t, h, pack(q), 5*time.Second); m == nil || !slices.Equal(addrs(m), []string{"198.51.100.10"}) {
		t.Errorf("query: %v", m)
	}
}

// A filter listening on the unspecified address answers from the address asked.
func TestUDPWildcardListenerAnswersFromTheAddressAsked(t *testing.T) {
	h := startFilter(t, testPolicy, func(c *Config) { c.Addr = "0.0.0.0:0" })
	port := h.srv.Addr().Port()
	// asked at 127.0.0.2 from 127.0.0.1 (the sandbox's address): the kernel alone would
	// answer from 127.0.0.1
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: int(port)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 { // a miss, a hit, a prepared answer
		m := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		// a connected socket only receives from 127.0.0.2:port: an answer from another
		// source address never arrives
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no answer from the address asked: %v", err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil || r.Id != m.Id || !slices.Equal(addrs(r), []string{"198.51.100.10"}) {
			t.Fatalf("answer %v %v", r, err)
		}
	}
}
