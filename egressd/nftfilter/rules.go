package nftfilter

import (
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Per-sandbox object names. Sandbox ids are used verbatim (nftables names are
// length-limited byte strings, not identifiers, over netlink).
func chainName(id string) string       { return "sbx_" + id }
func srcSet(f fam, id string) string   { return "src" + f.suffix + "_" + id }
func resSet(f fam, id string) string   { return "res" + f.suffix + "_" + id }
func learnSet(f fam, id string) string { return "learn" + f.suffix + "_" + id }

// grantSet holds the port-restricted learned grants: intervals of daddr . l4proto .
// dport, each element with its own timeout.
func grantSet(f fam, id string) string { return "learnp" + f.suffix + "_" + id }
func flowSet(f fam, id string) string  { return "flow" + f.suffix + "_" + id }

// inSet holds the flows of inbound connections (the sandbox's SYN-ACK recorded them):
// a policy change never cuts them, they are replies to a client (the gateway).
func inSet(f fam, id string) string { return "in" + f.suffix + "_" + id }
func dropCounter(id string) string  { return "drops_" + id }
func flowCounter(id string) string  { return "flows_" + id }

// logPrefix encodes an event for the NFLOG reader: "al <kind> <reason> <rule> <id>".
func logPrefix(kind datapath.Kind, reason datapath.Reason, rule uint16, id string) string {
	return fmt.Sprintf("al %d %d %d %s", kind, reason, rule, id)
}

// chainRules builds the sandbox's ingress chain in evaluation order (the packet
// semantics of package datapath, step by step).
func (f *Filter) chainRules(id string, p datapath.Policy) [][]expr.Any {
	var rules [][]expr.Any
	add := func(r ...[]expr.Any) { rules = append(rules, cat(r...)) }
	dropSilently := func(reason datapath.Reason) []expr.Any {
		return cat(one(counter(dropCounter(id))), f.logExpr(datapath.KindDrop, reason, 0, id), one(drop))
	}
	// refuse ends a denied packet's rule so that the caller fails at once: a TCP reset
	// for TCP, ICMP administratively prohibited for the rest (two rules, TCP first).
	refuse := func(match []expr.Any, reason datapath.Reason, rule uint16) {
		act := cat(one(counter(dropCounter(id))), f.logExpr(datapath.KindDrop, reason, rule, id))
		add(match, l4proto(protoTC), act, one(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
		// (The ICMP error needs the packet marked for this host: hostChain.)
		add(match, act, one(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}))
	}
	// wouldDrop passes a packet the policy would drop in enforce mode, reporting it.
	wouldDrop := func(match []expr.Any, reason datapath.Reason, rule uint16) {
		add(match, f.logExpr(datapath.KindWouldDrop, reason, rule, id), one(accept))
	}
	deny := func(match []expr.Any, reason datapath.Reason, rule uint16) {
		if p.Report {
			wouldDrop(match, reason, rule)
			return
		}
		refuse(match, reason, rule)
	}
	allowNew := func(fm fam, reason datapath.Reason, rule uint16) []expr.Any {
		return cat(flowKey(fm), one(addFlow(flowSet(fm, id), f.cfg.FlowIdle), counter(flowCounter(id))),
			f.logExpr(datapath.KindFlow, reason, rule, id), one(accept))
	}

	// 1. neighbour discovery
	add(nfproto(v6), l4proto(unix.IPPROTO_ICMPV6), icmpType(133, 137), one(accept))
	for _, fm := range []fam{v4, v6} {
		// 2. source address
		// (dropped silently even in report mode: a refusal would answer a forged address)
		add(nfproto(fm), addrInSet(fm, true, srcSet(fm, id), true), dropSilently(datapath.ReasonSpoofed))
		// 3. DNS only to the resolver, no DoT
		for _, pr := range []byte{protoTC, protoUD} {
			add(nfproto(fm), l4proto(pr), dport(53, 53), addrInSet(fm, false, resSet(fm, id), false), one(accept))
			deny(cat(nfproto(fm), l4proto(pr), dport(53, 53)), datapath.ReasonDNS, 0)
			deny(cat(nfproto(fm), l4proto(pr), dport(853, 853)), datapath.ReasonDoT, 0)
		}
	}
	// 4. IPv6 blocked
	if p.IPv6 == datapath.IPv6Block {
		deny(nfproto(v6), datapath.ReasonIPv6Blocked, 0)
	}
	for _, fm := range []fam{v4, v6} {
		if fm == v6 && p.IPv6 == datapath.IPv6Block {
			continue
		}
		// 5. established flows; inbound connections (SYN-ACK answers an inbound SYN)
		add(nfproto(fm), flowKey(fm), one(&expr.Lookup{SourceRegister: regCat, SetName: flowSet(fm, id)}),
			one(addFlow(flowSet(fm, id), f.cfg.FlowIdle), accept))
		add(nfproto(fm), l4proto(fm.icmp), icmpType(fm.echoReply, fm.echoReply), one(accept))
		add(nfproto(fm), flowKey(fm), one(&expr.Lookup{SourceRegister: regCat, SetName: inSet(fm, id)}),
			one(addFlow(inSet(fm, id), f.cfg.FlowIdle), accept))
		add(nfproto(fm), l4proto(protoTC), tcpFlags(0x12, 0x12), flowKey(fm), one(addFlow(inSet(fm, id), f.cfg.FlowIdle), accept))
		// A reset is the sandbox kernel's answer to an inbound packet it has no socket
		// for (lifecycle's readiness probe before execd listens, the gateway before the
		// app listens): without CAP_NET_RAW the sandbox cannot forge one, and only the
		// host reaches it, so a reset carries nothing out. Accepted, not recorded, so
		// Airlock's own probes never read as denials.
		add(nfproto(fm), l4proto(protoTC), tcpFlags(0x04, 0x04), one(accept))
		// 6. static rules, in order
		for _, r := range p.Rules {
			if r.Prefix.Addr().Is4() != (fm == v4) {
				continue
			}
			m := cat(nfproto(fm), daddrIn(fm, r.Prefix))
			if r.Proto != datapath.ProtoAny {
				m = cat(m, l4proto(byte(r.Proto)))
			}
			if !r.Ports.All() {
				lo, hi := r.Ports.Bounds()
				m = cat(m, dport(lo, hi))
			}
			switch r.Action {
			case datapath.ActionAllow:
				add(m, allowNew(fm, datapath.ReasonRuleAllow, r.ID))
			case datapath.ActionDenyAlways:
				refuse(m, datapath.ReasonRuleDeny, r.ID)
			case datapath.ActionDenyAudit:
				wouldDrop(m, datapath.ReasonRuleDeny, r.ID)
			default:
				deny(m, datapath.ReasonRuleDeny, r.ID)
			}
		}
		// 7. L7 redirect mark
		if p.L7 {
			for _, port := range []uint16{80, 443} {
				add(nfproto(fm), l4proto(protoTC), dport(port, port), setMark(f.cfg.L7Mark, f.cfg.L7MarkMask), one(accept))
			}
		}
		// 8. learned
		add(nfproto(fm), addrInSet(fm, false, learnSet(fm, id), false), allowNew(fm, datapath.ReasonLearned, 0))
		add(nfproto(fm), grantKey(fm), one(&expr.Lookup{SourceRegister: regCat, SetName: grantSet(fm, id)}),
			allowNew(fm, datapath.ReasonLearned, 0))
		// 9. default
		if p.Default == datapath.ActionAllow {
			add(nfproto(fm), allowNew(fm, datapath.ReasonDefaultAllow, 0))
			add(nfproto(fm), one(accept)) // packets without a transport header to key on
		} else {
			deny(nfproto(fm), datapath.ReasonDefaultDeny, 0)
		}
	}
	return rules
}

// log returns the NFLOG expression for an event, or nothing when events are off.
func (f *Filter) logExpr(kind datapath.Kind, reason datapath.Reason, rule uint16, id string) []expr.Any {
	if f.cfg.LogGroup == 0 {
		return nil
	}
	return one(&expr.Log{
		Key:   1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX,
		Group: f.cfg.LogGroup,
		Data:  []byte(logPrefix(kind, reason, rule, id)),
	})
}

// asHostPacket marks a packet that the kernel marked for another host as for this host
// (meta pkttype otherhost meta pkttype set host).
func asHostPacket() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.PACKET_OTHERHOST}},
		&expr.Immediate{Register: 1, Data: []byte{unix.PACKET_HOST}},
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, SourceRegister: true, Register: 1},
	}
}
