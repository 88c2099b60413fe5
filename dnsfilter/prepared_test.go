package dnsfilter

import (
	"bytes"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/airlockdev/airlock/audit"
)

// exchangeRaw sends q with id over UDP and returns the answer's bytes.
func exchangeRaw(t *testing.T, addr string, q *dns.Msg, id uint16) []byte {
	t.Helper()
	q.Id = id
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := uint16(buf[0])<<8 | uint16(buf[1]); got != id {
		t.Fatalf("answer id %d, want %d", got, id)
	}
	return buf[:n]
}

// A cached name asked again is answered from its prepared bytes: the same answer as the
// one built in full, for each form of the query, with the hook and the audit record of
// every query, and never across a policy change.
func TestPreparedAnswerIsTheAnswer(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	addr := h.srv.Addr().String()
	plain := func() *dns.Msg { return new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA) }
	// each form differs from the one before it in one part the answer echoes
	forms := []struct {
		name string
		msg  func() *dns.Msg
	}{
		{"plain", plain},
		{"cd", func() *dns.Msg { m := plain(); m.CheckingDisabled = true; return m }},
		{"case", func() *dns.Msg { return new(dns.Msg).SetQuestion("AlLoWeD.example.COM.", dns.TypeA) }},
		{"plain", plain},
		{"no-rd", func() *dns.Msg { m := plain(); m.RecursionDesired = false; return m }},
		{"edns", func() *dns.Msg { return plain().SetEdns0(1232, false) }},
		{"do", func() *dns.Msg { return plain().SetEdns0(1232, true) }},
		{"edns", func() *dns.Msg { return plain().SetEdns0(1232, false) }},
	}
	exchangeRaw(t, addr, plain(), 1) // a miss: forwarded and cached
	before := testutil.ToFloat64(h.srv.metrics.cacheHit)
	queries := 0
	for _, fm := range forms {
		name, form := fm.name, fm.msg
		var answers [][]byte
		for i := range 4 { // the first is built in full from the cache, the others prepared
			b := exchangeRaw(t, addr, form(), uint16(100+i))
			queries++
			answers = append(answers, b)
		}
		m := new(dns.Msg)
		if err := m.Unpack(answers[0]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		q := form()
		if m.Question[0].Name != q.Question[0].Name || m.RecursionDesired != q.RecursionDesired ||
			m.CheckingDisabled != q.CheckingDisabled || (m.IsEdns0() != nil) != (q.IsEdns0() != nil) ||
			(q.IsEdns0() != nil && m.IsEdns0().Do() != q.IsEdns0().Do()) || !slices.Equal(addrs(m), []string{"198.51.100.10"}) {
			t.Errorf("%s: answer does not echo the query: %v", name, m)
		}
		for i, b := range answers[1:] {
			// equal apart from the id (all within a second or two: allow a TTL one lower)
			if !bytes.Equal(b[2:], answers[0][2:]) && !sameButTTL(t, b, answers[0]) {
				t.Errorf("%s: prepared answer %d differs from the built one:\n%x\n%x", name, i+1, b, answers[0])
			}
		}
	}
	hits, prepared := testutil.ToFloat64(h.srv.metrics.cacheHit)-before, testutil.ToFloat64(h.srv.metrics.cachePrepared)
	if hits+prepared != float64(queries) || prepared < float64(3*len(forms)) {
		t.Errorf("%v cache hits and %v prepared answers, want %d in all, at least %d prepared", hits, prepared, queries, 3*len(forms))
	}
	if got := len(h.rec.learns()); got != queries+1 {
		t.Errorf("learning hook ran %d times, want %d (every answer is learned)", got, queries+1)
	}
	var cached int
	for _, r := range h.rec.all() {
		if r.DstHost == "allowed.example.com" && r.Action == "allow" && r.Extra["cached"] == true {
			cached++
		}
	}
	if cached != queries {
		t.Errorf("%d cached allow records, want one per query (%d)", cached, queries)
	}
	// a new policy version never gets the old version's prepared answer
	h.setPolicy(t, "egress:\n  - {action: deny, target: allowed.example.com}\n")
	m := new(dns.Msg)
	if err := m.Unpack(exchangeRaw(t, addr, plain(), 7)); err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("after a policy change: %v %v", m, err)
	}
}

// Answers with dropped addresses are not prepared: each query writes its deny records.
func TestRebindingDropsAuditedPerQuery(t *testing.T) {
	h := startFilter(t, testPolicy, nil)
	for range 4 {
		if r := h.ask(t, "udp", "rebind.example.com", dns.TypeA, 0); !slices.Equal(addrs(r), []string{"198.51.100.13"}) {
			t.Fatalf("answer = %v", addrs(r))
		}
	}
	var denies int
	for _, r := range h.rec.all() {
		if r.Action == "deny" && r.DstHost == "rebind.example.com" && r.Source == audit.SourceDNS {
			denies++
		}
	}
	if denies != 8 {
		t.Errorf("%d deny records for dropped addresses, want 2 per query (8)", denies)
	}
}

// sameButTTL reports whether a and b differ only in their id and by at most 1 in TTLs.
func sameButTTL(t *testing.T, a, b []byte) bool {
	t.Helper()
	ma, mb := new(dns.Msg), new(dns.Msg)
	if ma.Unpack(a) != nil || mb.Unpack(b) != nil || len(ma.Answer) != len(mb.Answer) {
		return false
	}
	for i := range ma.Answer {
		ta, tb := ma.Answer[i].Header().Ttl, mb.Answer[i].Header().Ttl
		if ta > tb+1 || tb > ta+1 {
			return false
		}
		ma.Answer[i].Header().Ttl = tb
	}
	ma.Id = mb.Id
	return ma.String() == mb.String()
}
