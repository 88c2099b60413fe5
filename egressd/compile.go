package egressd

import (
	"net/netip"
	"slices"

	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/policies"
)

// compiled is a sandbox's policy in the two forms egressd needs: the decider the DNS
// filter asks about names, and the address-level policy the datapath enforces.
type compiled struct {
	decider *policies.Decider
	policy  datapath.Policy
	// rules names the policy rule behind each datapath rule ID (index = ID), for audit.
	rules []string
}

// compileOptions are the node's side of compilation: which proxies egressd runs.
type compileOptions struct {
	l7 bool // the transparent L7 proxy (Config.L7Port)
	// credential: the sandbox's HTTP(S) goes through the L7 proxy for its Credential
	// Vault (credentialProxy.enabled, Config.Vault).
	credential bool
	proxy      netip.AddrPort // the explicit proxy (Config.ProxyPort), zero when off
}

// proxyRef names the datapath rule that lets sandboxes reach the explicit proxy.
const proxyRef = "proxy"

// guardRef names the datapath rules that keep special addresses (policies.Classify)
// out of catch-all allows and an allow default.
const guardRef = "guard"

// compile turns a decider into the datapath policy with the same meaning
// (policies package documentation, "Semantics"):
//   - IPRules in order become datapath rules (one per protocol and port range); a rule
//     without protocols covers TCP and UDP, a deny rule without protocols every protocol;
//   - before the first catch-all allow, and before an allow default, deny rules for
//     every special prefix (private, loopback, link-local, ...) keep them unreachable
//     unless an explicit earlier rule allows them;
//   - IPv6 is filtered with the same semantics as IPv4 (a dual-stack sandbox reaches
//     a name's AAAA addresses and the policy's IPv6 CIDRs; the special prefixes cover
//     ULA, link-local, IPv4-mapped and the other IPv6 ranges);
//   - overlay deny rules and the guard are ActionDenyAlways: audit mode passes and
//     reports what the policy would drop, never what the overlay or the guard drop
//     (in audit mode the guard also precedes a deny default);
//   - a deny rule in audit mode (policies.IPRule.Audit) is ActionDenyAudit in a
//     policy that enforces (ActionDeny, relaxed by Report, in one in audit mode),
//     preceded by ActionDenyAlways for the special addresses it covers (floorOf);
//     a deny rule with mode: enforce in a policy in audit mode is ActionDenyAlways.
//
// With o.l7 (egressd runs its L7 proxy) a policy in L7 mode sni marks TCP 80/443 for
// it. With o.proxy (egressd runs its explicit proxy) the first rule allows TCP to it:
// the proxy is on the host, which the overlay denies.
func compile(d *policies.Decider, o compileOptions) compiled {
	c := compiled{decider: d, rules: []string{""}}
	if o.proxy.IsValid() {
		a := o.proxy.Addr().Unmap()
		c.add(datapath.Rule{Prefix: netip.PrefixFrom(a, a.BitLen()), Proto: datapath.ProtoTCP,
			Ports: datapath.PortRange{First: o.proxy.Port(), Last: o.proxy.Port()}, Action: datapath.ActionAllow}, proxyRef)
	}
	guarded := false
	guard := func() {
		if guarded {
			return
		}
		guarded = true
		for _, p := range policies.SpecialPrefixes() {
			if p.Addr().Is4In6() {
				// ::ffff:0:0/96 would be unmapped to 0.0.0.0/0 by the datapath: IPv4
				// destinations are guarded by their own prefixes.
				continue
			}
			c.add(datapath.Rule{Prefix: p, Action: datapath.ActionDenyAlways}, guardRef)
		}
	}
	report := d.Mode() == policies.AuditMode
	for _, r := range d.IPRules() {
		action := datapath.ActionDeny
		switch {
		case r.Overlay || (report && !r.Audit):
			// the overlay, and a deny rule with mode: enforce in a policy in audit mode
			action = datapath.ActionDenyAlways
		case r.Audit && !report:
			action = datapath.ActionDenyAudit
		}
		if r.Action == policies.Allow {
			action = datapath.ActionAllow
			if r.CatchAll {
				guard()
			}
		}
		protos := []datapath.Proto{datapath.ProtoAny}
		if len(r.Protocols) > 0 || action == datapath.ActionAllow || len(r.Ports) > 0 {
			protos = protocols(r.Protocols)
		}
		ports := []datapath.PortRange{{}}
		if len(r.Ports) > 0 {
			ports = ports[:0]
			for _, p := range r.Ports {
				ports = append(ports, datapath.PortRange{First: p.First, Last: p.Last})
			}
		}
		if r.Action == policies.Deny && r.Audit {
			// A deny in audit mode never opens the floor: where it covers special
			// addresses they stay denied (the guard, as DecideAddr says), ahead of it.
			for _, sp := range floorOf(r.Prefix) {
				for _, proto := range protos {
					for _, pr := range ports {
						c.add(datapath.Rule{Prefix: sp, Proto: proto, Ports: pr, Action: datapath.ActionDenyAlways}, guardRef)
					}
				}
			}
		}
		for _, proto := range protos {
			for _, pr := range ports {
				c.add(datapath.Rule{Prefix: r.Prefix.Masked(), Proto: proto, Ports: pr, Action: action}, r.Rule)
			}
		}
	}
	c.policy.Default = datapath.ActionDeny
	if d.DefaultAction() == policies.Allow {
		guard()
		c.policy.Default = datapath.ActionAllow
	}
	if report {
		guard() // audit mode passes the default's drops, never the guard's
	}
	c.policy.IPv6 = datapath.IPv6Filter
	c.policy.Report = report
	c.policy.CountFlows = d.AuditLevel() == policies.AuditAll
	c.policy.L7 = o.l7 && (d.L7() == policies.L7SNI || o.credential)
	return c
}

// floorOf returns the parts of prefix p that are special addresses
// (policies.SpecialPrefixes): for each special prefix overlapping p, the narrower of the
// two. IPv4-mapped IPv6 is skipped as in the guard (IPv4 has its own prefixes).
func floorOf(p netip.Prefix) []netip.Prefix {
	p = p.Masked()
	var out []netip.Prefix
	for _, sp := range policies.SpecialPrefixes() {
		if sp.Addr().Is4In6() || sp.Addr().Is4() != p.Addr().Is4() || !sp.Overlaps(p) {
			continue
		}
		if sp.Bits() >= p.Bits() {
			out = append(out, sp)
		} else {
			out = append(out, p)
		}
	}
	return out
}

// l7Ports are the ports a name allow rule without ports reaches under `l7: sni` (when
// egressd runs its L7 proxy): the ones the proxy checks, HTTP and HTTPS.
var l7Ports = []policies.PortRange{{First: 80, Last: 80}, {First: 443, Last: 443}}

// l7Scope narrows p, a policy with `l7: sni` checked by the L7 proxy, to what the proxy
// can check. The proxy sees TCP 80 and 443 only, so every other port and protocol of a
// learned address would bypass the SNI/Host check (a CDN address serves many sites: TLS
// on 8443, HTTP/3 over UDP 443). An allow rule for a name or a "*.suffix" wildcard
// therefore defaults to ports 80 and 443 (l7Ports) instead of every port, and to TCP
// instead of TCP and UDP: other ports, and UDP (QUIC), need a rule that names them,
// and reach the learned address unchecked. Deny rules, address and CIDR rules and "*"
// keep their meaning. p is changed in place (it comes from policies.Parse).
func l7Scope(p *policies.Policy) {
	for i, r := range p.Egress {
		if r.Action != policies.Allow || len(r.Ports) > 0 {
			continue
		}
		t, err := policies.ParseTarget(r.Target)
		if err != nil || (t.Kind != policies.KindName && t.Kind != policies.KindWildcard) {
			continue
		}
		p.Egress[i].Ports = slices.Clone(l7Ports)
		if len(r.Protocols) == 0 {
			p.Egress[i].Protocols = []policies.Protocol{policies.TCP}
		}
	}
}

func (c *compiled) add(r datapath.Rule, ref string) {
	r.ID = uint16(len(c.rules))
	c.rules = append(c.rules, ref)
	c.policy.Rules = append(c.policy.Rules, r)
}

// rule returns the policy rule reference behind a datapath rule ID ("" when unknown).
func (c *compiled) rule(id uint16) string {
	if int(id) < len(c.rules) {
		return c.rules[id]
	}
	return ""
}

// protocols maps a rule's protocols to datapath protocols; none means TCP and UDP.
func protocols(ps []policies.Protocol) []datapath.Proto {
	if len(ps) == 0 {
		return []datapath.Proto{datapath.ProtoTCP, datapath.ProtoUDP}
	}
	out := make([]datapath.Proto, 0, len(ps))
	for _, p := range ps {
		switch p {
		case policies.TCP:
			out = append(out, datapath.ProtoTCP)
		case policies.UDP:
			out = append(out, datapath.ProtoUDP)
		default:
			out = append(out, datapath.ProtoAny)
		}
	}
	return out
}
