package propose

import (
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/httppath"
)

// Count is how often something was seen in the records, and how many of those the
// policy then in force did not allow (denied, or would-deny in report/audit mode).
type Count struct {
	Seen    int `json:"seen"`
	Refused int `json:"refused"`
}

func (c *Count) add(refused bool) {
	c.Seen++
	if refused {
		c.Refused++
	}
}

func (c *Count) merge(o Count) { c.Seen += o.Seen; c.Refused += o.Refused }

// Refused reports whether a record's destination was not allowed by the policy in
// force: a deny, or a would-deny of report or audit mode (the would_deny flag, or an
// action spelled "would_deny" / "would-deny").
func Refused(r audit.Record) bool {
	if r.WouldDeny {
		return true
	}
	switch strings.ToLower(strings.ReplaceAll(r.Action, "-", "_")) {
	case "deny", "would_deny":
		return true
	}
	return false
}

// verdict reports whether r is a policy verdict (allow, deny, would-deny), not a loss or
// suppression record.
func verdict(r audit.Record) bool { return r.Action == "allow" || Refused(r) }

type portKey struct {
	port  uint16
	proto policies.Protocol
}

type reqKey struct {
	method, path string
	port         uint16
}

// dest is one destination the sandbox reached or tried: a name, a wildcard (after
// generalising) or an address.
type dest struct {
	target  string
	addr    netip.Addr // valid for an address
	members []string   // the names a wildcard stands for
	first   int        // order of first appearance
	count   Count
	ports   map[portKey]Count
	reqs    map[reqKey]Count
}

func newDest(target string, first int) *dest {
	return &dest{target: target, first: first, ports: map[portKey]Count{}, reqs: map[reqKey]Count{}}
}

// observations is what the records say the sandbox did.
type observations struct {
	names   map[string]*dest
	addrs   map[netip.Addr]*dest
	skipped map[string]*Skipped
	order   []string // skipped keys in order
	n       int
	used    int
}

func (o *observations) name(n string) *dest {
	d, ok := o.names[n]
	if !ok {
		d = newDest(n, o.n)
		o.n++
		o.names[n] = d
	}
	return d
}

func (o *observations) addr(a netip.Addr) *dest {
	d, ok := o.addrs[a]
	if !ok {
		d = newDest(a.String(), o.n)
		d.addr = a
		o.n++
		o.addrs[a] = d
	}
	return d
}

func (o *observations) skip(target, reason string) {
	key := target + "\x00" + reason
	s, ok := o.skipped[key]
	if !ok {
		s = &Skipped{Target: target, Reason: reason}
		o.skipped[key] = s
		o.order = append(o.order, key)
	}
	s.Count++
}

// observe reads recs (in log order): DNS answers teach which names an address stands
// for, as egressd learns them, so that a flow to an address counts for its names.
func observe(recs []audit.Record) *observations {
	o := &observations{names: map[string]*dest{}, addrs: map[netip.Addr]*dest{}, skipped: map[string]*Skipped{}}
	ipNames := map[netip.Addr][]string{}
	for _, r := range recs {
		if !verdict(r) {
			continue
		}
		refused := Refused(r)
		switch r.Source {
		case audit.SourceDNS:
			if r.DstHost == "" {
				continue
			}
			n := policies.NormalizeName(r.DstHost)
			if !refused {
				for _, a := range answers(r) {
					if !slices.Contains(ipNames[a], n) {
						ipNames[a] = append(ipNames[a], n)
					}
				}
			}
			o.used++
			o.name(n).count.add(refused)
		case audit.SourceBPF:
			ip, err := netip.ParseAddr(r.DstIP)
			if err != nil || r.DstPort <= 0 || r.DstPort > 65535 {
				continue
			}
			ip = ip.WithZone("").Unmap()
			pk := portKey{uint16(r.DstPort), policies.Protocol(r.Proto)}
			if pk.proto != policies.TCP && pk.proto != policies.UDP {
				pk.proto = ""
			}
			names := ipNames[ip]
			if r.DstHost != "" {
				names = []string{policies.NormalizeName(r.DstHost)}
			}
			o.used++
			if len(names) == 0 || policies.Classify(ip).Special() {
				// No name stands for it, or a special address that only an
				// explicit IP rule allows (a name's rule never does).
				d := o.addr(ip)
				d.count.add(refused)
				c := d.ports[pk]
				c.add(refused)
				d.ports[pk] = c
				continue
			}
			for _, n := range names {
				d := o.name(n)
				d.count.add(refused)
				c := d.ports[pk]
				c.add(refused)
				d.ports[pk] = c
			}
		case audit.SourceL7:
			if r.DstHost == "" {
				o.skip(r.DstIP, "a connection without a TLS SNI or HTTP Host: no name to allow")
				continue
			}
			if r.DstPort <= 0 || r.DstPort > 65535 {
				continue
			}
			n := policies.NormalizeName(r.DstHost)
			d := o.name(n)
			port := uint16(r.DstPort)
			method, _ := r.Extra["method"].(string)
			path, _ := r.Extra["path"].(string)
			isReq, _ := r.Extra["http_rule"].(bool)
			o.used++
			d.count.add(refused)
			c := d.ports[portKey{port, policies.TCP}]
			c.add(refused)
			d.ports[portKey{port, policies.TCP}] = c
			if !isReq || method == "" {
				continue
			}
			if method == "CONNECT" {
				o.skip(n, "CONNECT inside an intercepted connection: never allowed")
				continue
			}
			if !pathExpressible(path) {
				o.skip(n+path, "a path no HTTP rule can match (not canonical, or holding *, ? or #): requests with it are refused before any rule")
				continue
			}
			k := reqKey{strings.ToUpper(method), path, port}
			rc := d.reqs[k]
			rc.add(refused)
			d.reqs[k] = rc
		}
	}
	return o
}

// pathExpressible reports whether an exact HTTP rule path can name p (a decoded path).
func pathExpressible(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "*?#") {
		return false
	}
	_, err := httppath.Canonical((&url.URL{Path: p}).EscapedPath())
	return err == nil
}

// answers reads the addresses of a DNS record (extra.answers: strings when read from
// the log, []string when built in memory).
func answers(r audit.Record) []netip.Addr {
	var ss []string
	switch v := r.Extra["answers"].(type) {
	case []string:
		ss = v
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				ss = append(ss, s)
			}
		}
	}
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
			out = append(out, a.WithZone("").Unmap())
		}
	}
	return out
}
