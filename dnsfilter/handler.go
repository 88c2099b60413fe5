package dnsfilter

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// advertisedUDPSize is the EDNS buffer size the filter advertises (DNS flag day 2020).
const advertisedUDPSize = 1232

// maxAuditAnswers bounds the addresses listed in one audit record.
const maxAuditAnswers = 16

// ServeDNS implements dns.Handler: one query, checked, forwarded, filtered, learned,
// audited, answered.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.QueryTimeout)
	defer cancel()
	src, proto := remote(w)
	rec := audit.Record{Time: start, Source: audit.SourceDNS, Proto: proto, Src: src.String()}
	if len(req.Question) > 0 {
		rec.DstHost, rec.QType = policies.NormalizeName(req.Question[0].Name), qtypeString(req.Question[0].Qtype)
	}
	sb, known := s.cfg.Lookup(src.Addr().Unmap())
	if !known || sb.Policy == nil {
		rec.Action, rec.Reason = "deny", "unknown source address"
		if s.cfg.Audit != nil {
			s.cfg.Audit.Append(rec)
		}
		s.finish(w, req, reply(req, dns.RcodeRefused), "unknown", start)
		return
	}
	d := sb.Policy
	rec.SandboxID, rec.Mode, rec.PolicyVersion = sb.ID, string(d.Mode()), d.Version()
	deny := func(rcode int, result, rule, reason string, ede uint16) {
		rec.Action, rec.Rule, rec.Reason = "deny", rule, reason
		s.audit(nil, rec, policies.Decision{})
		m := reply(req, rcode)
		m.Extra = edns(req, ede, reason)
		s.finish(w, req, m, result, start)
	}
	switch {
	case req.Opcode != dns.OpcodeQuery:
		deny(dns.RcodeNotImplemented, "malformed", "", "opcode "+dns.OpcodeToString[req.Opcode]+" not supported", 0)
		return
	case len(req.Question) != 1:
		deny(dns.RcodeFormatError, "malformed", "", fmt.Sprintf("%d questions", len(req.Question)), 0)
		return
	case req.Question[0].Qclass != dns.ClassINET:
		deny(dns.RcodeNotImplemented, "malformed", "", "class "+dns.ClassToString[req.Question[0].Qclass]+" not supported", 0)
		return
	}
	q := req.Question[0]
	name := rec.DstHost
	report := d.Mode() == policies.AuditMode
	var wouldDeny []string

	// 1. tunnelling guard: lengths, entropy, label score
	opts := d.DNS()
	reason := opts.CheckName(name)
	if reason == "" && opts.MaxLabelEntropy > 0 {
		reason = s.checkLabels(name)
	}
	if reason != "" {
		if !report {
			deny(dns.RcodeRefused, "guard", "dns.tunnelGuard", reason, dns.ExtendedErrorCodeProhibited)
			return
		}
		wouldDeny = append(wouldDeny, reason)
	}
	// 2. query type
	if !opts.AllowsType(q.Qtype) {
		reason := "query type " + rec.QType + " not allowed (allowed: " + strings.Join(opts.QueryTypes, ", ") + ")"
		if !report {
			deny(s.cfg.QTypeRcode, "qtype", "dns.queryTypes", reason, dns.ExtendedErrorCodeProhibited)
			return
		}
		wouldDeny = append(wouldDeny, reason)
	}
	// 3. the name itself: denied names never reach an upstream
	dec := d.DecideName(name, 0, "")
	if dec.Action == policies.Deny {
		deny(s.cfg.DenyRcode, "deny", dec.Rule, dec.Reason, dns.ExtendedErrorCodeBlocked)
		return
	}
	if dec.WouldDeny {
		wouldDeny = append(wouldDeny, dec.Reason)
	}
	// 3b. tunnelling guard: distinct names per sandbox, registrable domain and rule (a
	// denied name carries nothing out, so only names that may reach an upstream count)
	caps := s.caps
	if opts.MaxQueriesPerMinute > 0 {
		caps.domain = opts.MaxQueriesPerMinute
	}
	if reason := s.guard.admit(sb.ID, name, dec.Rule, caps, start); reason != "" {
		if !report {
			deny(dns.RcodeRefused, "guard", "dns.tunnelGuard", reason, dns.ExtendedErrorCodeProhibited)
			return
		}
		wouldDeny = append(wouldDeny, reason)
	}
	// 4. an answer prepared from the cache for this policy and this form of query
	key := cacheKey{name, q.Qtype}
	ak, reusable := answerKeyOf(w, req, d)
	if reusable && len(wouldDeny) == 0 {
		if p := s.cache.prepared(key, &ak, start); p != nil {
			s.metrics.cachePrepared.Inc()
			if !s.learn(ctx, w, req, sb.ID, name, p.f, dec, rec, start) {
				return
			}
			rec.Action, rec.Rule, rec.Reason, rec.Extra = "allow", dec.Rule, dec.Reason, p.extra
			s.audit(d, rec, dec)
			s.finishPrepared(w.(*udpWriter), req, p.wire, start)
			return
		}
	}
	// 5. upstream (cache, singleflight, failover, TCP on truncation)
	res, err := s.resolve(ctx, key)
	if err != nil {
		rec.Action, rec.Rule, rec.Reason = "allow", dec.Rule, "upstream failed: "+err.Error()
		rec.Extra = map[string]any{"rcode": "SERVFAIL"}
		s.audit(d, rec, dec)
		s.finish(w, req, reply(req, dns.RcodeServerFailure), "servfail", start)
		return
	}
	resp, cached := res.msg, res.entry != nil
	// 6. the answer: CNAME hops, addresses (rebinding), TTLs
	f := s.filter(d, name, resp)
	for _, dr := range f.drops {
		s.metrics.rebinding.Inc()
		r := rec
		r.DstIP, r.Action, r.Rule, r.Reason = dr.addr.String(), "deny", dr.dec.Rule, dr.dec.Reason
		s.audit(d, r, dr.dec)
	}
	if f.deniedHop != nil {
		deny(s.cfg.DenyRcode, "deny", f.deniedHop.Rule, "CNAME to "+f.hopName+": "+f.deniedHop.Reason, dns.ExtendedErrorCodeBlocked)
		return
	}
	wouldDeny = append(wouldDeny, f.wouldDeny...)
	m := reply(req, resp.Rcode)
	m.Answer, m.Ns = f.answer, f.ns
	m.Extra = edns(req, 0, "")
	// 7. learn before answering
	if !s.learn(ctx, w, req, sb.ID, name, f, dec, rec, start) {
		return
	}
	// 8. audit and answer
	rec.Action, rec.Rule, rec.Reason = "allow", dec.Rule, dec.Reason
	if len(wouldDeny) > 0 {
		rec.WouldDeny, rec.Reason = true, strings.Join(wouldDeny, "; ")
		dec.WouldDeny = true
	}
	rec.Extra = map[string]any{"rcode": dns.RcodeToString[resp.Rcode]}
	if cached {
		rec.Extra["cached"] = true
	}
	if n := len(f.addrs); n > 0 {
		ips := make([]string, 0, min(n, maxAuditAnswers))
		for _, a := range f.addrs[:min(n, maxAuditAnswers)] {
			ips = append(ips, a.String())
		}
		rec.Extra["answers"] = ips
		rec.Extra["ttl_s"] = int(f.ttl / time.Second)
	}
	s.audit(d, rec, dec)
	if cached && reusable && !rec.WouldDeny && len(f.drops) == 0 {
		s.prepare(res, ak, m, f, rec.Extra)
	}
	result := "allow"
	if rec.WouldDeny {
		result = "would_deny"
	}
	s.finish(w, req, m, result, start)
}

// learn hands f's addresses to the learning hook. When the hook fails it answers
// SERVFAIL, audits the failure and returns false.
func (s *Server) learn(ctx context.Context, w dns.ResponseWriter, req *dns.Msg, sandboxID, name string, f filtered,
	dec policies.Decision, rec audit.Record, start time.Time) bool {
	if len(f.addrs) == 0 || s.cfg.Learn == nil {
		return true
	}
	l := Learned{SandboxID: sandboxID, Name: name, Chain: f.chain, Addrs: f.addrs, TTL: f.ttl, Ports: dec.Ports}
	t0 := time.Now()
	err := s.cfg.Learn(ctx, l)
	s.metrics.learn.Observe(time.Since(t0).Seconds())
	if err == nil {
		return true
	}
	s.metrics.learnErrors.Inc()
	s.log.Error("dns learning hook failed", "sandbox_id", sandboxID, "name", name, "err", err)
	rec.Action, rec.Rule, rec.Reason = "deny", dec.Rule, "learning hook failed: "+err.Error()
	rec.Extra = map[string]any{"rcode": "SERVFAIL"}
	s.audit(nil, rec, policies.Decision{})
	s.finish(w, req, reply(req, dns.RcodeServerFailure), "servfail", start)
	return false
}

// finish counts the query and writes m, truncating UDP answers to the client's buffer
// (the client retries over TCP, RFC 7766).
func (s *Server) finish(w dns.ResponseWriter, req, m *dns.Msg, result string, start time.Time) {
	if _, proto := remote(w); proto == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(dns.MinMsgSize, min(int(opt.UDPSize()), advertisedUDPSize))
		}
		m.Truncate(size)
	}
	// Counted before the write so that a client that has its answer also sees it counted.
	s.metrics.count(result, start)
	s.reply(w, m)
}

// reply starts an answer to req with rcode.
func reply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	m.Compress = true
	return m
}

// edns returns the additional section for an answer: an OPT record when the client
// sent one, with an Extended DNS Error when ede is set.
func edns(req *dns.Msg, ede uint16, text string) []dns.RR {
	in := req.IsEdns0()
	if in == nil {
		return nil
	}
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	opt.SetUDPSize(advertisedUDPSize)
	opt.SetDo(in.Do())
	if ede != 0 {
		if len(text) > 200 {
			text = text[:200]
		}
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: ede, ExtraText: text})
	}
	return []dns.RR{opt}
}

func remote(w dns.ResponseWriter) (netip.AddrPort, string) {
	if u, ok := w.(*udpWriter); ok {
		return u.remote, "udp"
	}
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		return a.AddrPort(), "udp"
	case *net.TCPAddr:
		return a.AddrPort(), "tcp"
	case proxyAddr:
		return a.ap, ProtoProxy
	}
	ap, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	return ap, "udp"
}

func qtypeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

// checkLabels scores each label of name (labelScore) against the operator's
// MaxLabelBits, and all of them together against twice that (data split over several
// labels): "" when the name passes, else the reason.
func (s *Server) checkLabels(name string) string {
	limit := s.cfg.Guard.MaxLabelBits
	if limit <= 0 {
		return ""
	}
	var total float64
	for label := range strings.SplitSeq(name, ".") {
		b := labelScore(label)
		if b > limit {
			return fmt.Sprintf("label of %d characters carries about %.0f bits of random-looking text (limit %.0f; possible DNS tunnelling)",
				len(label), b, limit)
		}
		total += b
	}
	if total > 2*limit {
		return fmt.Sprintf("labels carry about %.0f bits of random-looking text together (limit %.0f; possible DNS tunnelling)", total, 2*limit)
	}
	return ""
}
