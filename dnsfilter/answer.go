package dnsfilter

import (
	"net/netip"
	"slices"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/policies"
)

// maxChain bounds the CNAME hops followed in one answer.
const maxChain = 16

// filtered is an upstream answer after the policy has been applied to it.
type filtered struct {
	answer, ns []dns.RR
	chain      []string
	addrs      []netip.Addr
	ttl        time.Duration
	drops      []drop
	wouldDeny  []string
	// deniedHop is set when the CNAME chain reaches a denied name (hopName).
	deniedHop *policies.Decision
	hopName   string
}

type drop struct {
	addr netip.Addr
	dec  policies.Decision
}

// filter applies the policy to resp, an answer for name: every CNAME hop from name is
// decided like a query name, records not on the chain are dropped, each address is
// classified (DecideLearned: rebinding into special ranges is dropped), SVCB/HTTPS
// address hints are removed (clients could connect to them unlearned), and TTLs are
// capped at the learned TTL.
func (s *Server) filter(d *policies.Decider, name string, resp *dns.Msg) filtered {
	var f filtered
	f.chain = []string{name}
	cur := name
	for range maxChain {
		next := ""
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && policies.NormalizeName(c.Hdr.Name) == cur {
				next = policies.NormalizeName(c.Target)
				break
			}
		}
		if next == "" || slices.Contains(f.chain, next) {
			break
		}
		dec := d.DecideName(next, 0, "")
		if dec.Action == policies.Deny {
			f.deniedHop, f.hopName = &dec, next
			return f
		}
		if dec.WouldDeny {
			f.wouldDeny = append(f.wouldDeny, "CNAME to "+next+": "+dec.Reason)
		}
		f.chain = append(f.chain, next)
		cur = next
	}
	minTTL := uint32(0)
	haveTTL := false
	for _, rr := range resp.Answer {
		if !slices.Contains(f.chain, policies.NormalizeName(rr.Header().Name)) {
			continue // not about the asked name: never passed on
		}
		var addr netip.Addr
		switch v := rr.(type) {
		case *dns.A:
			addr, _ = netip.AddrFromSlice(v.A.To4())
		case *dns.AAAA:
			addr, _ = netip.AddrFromSlice(v.AAAA.To16())
		case *dns.HTTPS:
			v.Value = stripHints(v.Value)
		case *dns.SVCB:
			v.Value = stripHints(v.Value)
		case *dns.DNAME:
			continue // the synthesized CNAME carries the hop
		}
		if rr.Header().Rrtype == dns.TypeA || rr.Header().Rrtype == dns.TypeAAAA {
			if !addr.IsValid() {
				continue
			}
			dec := d.DecideLearned(name, addr, 0, "")
			if dec.Action == policies.Deny {
				f.drops = append(f.drops, drop{addr, dec})
				continue
			}
			if dec.WouldDeny {
				f.wouldDeny = append(f.wouldDeny, dec.Reason)
			}
			f.addrs = append(f.addrs, addr)
			if !haveTTL || rr.Header().Ttl < minTTL {
				minTTL, haveTTL = rr.Header().Ttl, true
			}
		}
		f.answer = append(f.answer, rr)
	}
	f.ttl = s.cfg.MaxTTL
	if haveTTL {
		f.ttl = min(max(time.Duration(minTTL)*time.Second, s.cfg.MinTTL), s.cfg.MaxTTL)
	}
	capTTL := uint32(f.ttl / time.Second)
	for _, rr := range f.answer {
		rr.Header().Ttl = min(rr.Header().Ttl, capTTL)
	}
	for _, rr := range resp.Ns {
		if rr.Header().Rrtype == dns.TypeSOA {
			rr.Header().Ttl = min(rr.Header().Ttl, uint32(s.cfg.MaxTTL/time.Second))
			f.ns = append(f.ns, rr)
		}
	}
	return f
}

func stripHints(kv []dns.SVCBKeyValue) []dns.SVCBKeyValue {
	return slices.DeleteFunc(kv, func(v dns.SVCBKeyValue) bool {
		k := v.Key()
		return k == dns.SVCB_IPV4HINT || k == dns.SVCB_IPV6HINT
	})
}
