package dnsfilter

import (
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/policies"
)

// Prepared answers. Answering a cached name again under the same policy would repeat
// the same work: copy the cached upstream answer, filter it, pack it. The filter keeps
// the result with the cache entry instead, packed and with its audit facts, and the
// next such query over UDP is answered by copying the bytes and setting the message id.
// The policy checks before the answer (guard, query type, name decision), the learning
// hook and the audit record still run for every query.
//
// A prepared answer is keyed by everything that shaped it: the policy (a new version
// is a new *policies.Decider), the age in whole seconds of the cached answer (TTLs are
// aged by it), and the parts of the query an answer echoes (the question name as
// asked, RD, CD, EDNS and its DO bit). Only plain allowed answers are prepared: none in
// report mode with a would-deny, none with addresses dropped (their deny records are
// written per query), none larger than 512 bytes (no client needs them truncated).

// maxPrepared bounds the prepared answers kept per cache entry.
const maxPrepared = 4

// answerKey identifies a prepared answer within a cache entry.
type answerKey struct {
	policy *policies.Decider
	age    uint32 // set by cache.prepared
	qname  string
	flags  uint8
}

const (
	flagRD = 1 << iota
	flagCD
	flagEDNS
	flagDO
)

// prepared is an allowed answer ready to send again.
type prepared struct {
	wire  []byte // the packed answer, message id 0
	f     filtered
	extra map[string]any // the audit record's extra; shared, never modified
}

// answerKeyOf returns req's key under d, and whether its answer may be prepared: only
// UDP queries are answered from prepared bytes.
func answerKeyOf(w dns.ResponseWriter, req *dns.Msg, d *policies.Decider) (answerKey, bool) {
	if _, ok := w.(*udpWriter); !ok {
		return answerKey{}, false
	}
	k := answerKey{policy: d, qname: req.Question[0].Name}
	if req.RecursionDesired {
		k.flags |= flagRD
	}
	if req.CheckingDisabled {
		k.flags |= flagCD
	}
	if opt := req.IsEdns0(); opt != nil {
		k.flags |= flagEDNS
		if opt.Do() {
			k.flags |= flagDO
		}
	}
	return k, true
}

// prepared returns the prepared answer for ak in k's unexpired cache entry, or nil; it
// sets ak.age.
func (c *cache) prepared(k cacheKey, ak *answerKey, now time.Time) *prepared {
	if c.max < 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.expires) {
		return nil
	}
	ak.age = uint32(now.Sub(e.stored) / time.Second)
	return e.answers[*ak]
}

// prepare keeps m, the answer just built from res (a cache hit), for the next query
// with the same key.
func (s *Server) prepare(res resolved, ak answerKey, m *dns.Msg, f filtered, extra map[string]any) {
	wire, err := m.Pack()
	if err != nil || len(wire) > dns.MinMsgSize {
		return
	}
	wire[0], wire[1] = 0, 0
	ak.age = res.age
	p := &prepared{wire: wire, f: filtered{chain: f.chain, addrs: f.addrs, ttl: f.ttl}, extra: extra}
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	e := res.entry
	if e.answers == nil || len(e.answers) >= maxPrepared {
		e.answers = make(map[answerKey]*prepared, maxPrepared)
	}
	e.answers[ak] = p
}

// finishPrepared counts the query and writes the prepared answer wire with req's id.
func (s *Server) finishPrepared(w *udpWriter, req *dns.Msg, wire []byte, start time.Time) {
	b := w.buf
	if len(b) < len(wire) {
		b = make([]byte, len(wire))
	}
	b = b[:copy(b, wire)]
	b[0], b[1] = byte(req.Id>>8), byte(req.Id)
	s.metrics.count("allow", start)
	if _, err := w.Write(b); err != nil {
		s.log.Debug("dns write failed", "err", err)
	}
}
