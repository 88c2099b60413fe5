package policies

import (
	"fmt"
	"net/netip"
	"strings"
)

// FloorEntry is one item of the platform floor: what no sandbox policy can allow.
type FloorEntry struct {
	// Rule is the reference decisions carry: "overlay.alwaysDeny[3]", or "guard" for a
	// special-address class.
	Rule string `json:"rule"`
	// Target is the denied name, address or prefix (for the guard: the class's prefix).
	Target string `json:"target"`
	// Source is "built-in" (BuiltinDeny), "operator" (added by the operator or the
	// deployment: this host's addresses, the sandbox network, the cluster's ranges,
	// egress.deny) or "guard" (a special-address class).
	Source string `json:"source"`
	// Note says what it is, for humans.
	Note string `json:"note"`
	// Overridable is true for the guard only: an explicit IP/CIDR allow rule of a
	// policy reaches a special address; names, catch-alls and the default never do.
	// Overlay entries are never overridable.
	Overridable bool `json:"overridable"`
}

// builtinNotes describes BuiltinDeny's entries by target.
var builtinNotes = map[string]string{
	"169.254.169.254":            "instance metadata (AWS, GCP, Azure, Oracle, DigitalOcean, IBM, Hetzner, OpenStack)",
	"fd00:ec2::254":              "AWS instance metadata over IPv6",
	"100.100.100.200":            "Alibaba Cloud metadata",
	"169.254.0.0/16":             "link-local (ECS task metadata, EKS Pod Identity, Time Sync, Route 53 Resolver, ...)",
	"fe80::/10":                  "IPv6 link-local",
	"127.0.0.0/8":                "loopback",
	"::1":                        "IPv6 loopback",
	"0.0.0.0/8":                  "unspecified",
	"::":                         "IPv6 unspecified",
	"localhost":                  "localhost name",
	"*.localhost":                "localhost names",
	"metadata.google.internal":   "GCP metadata by name",
	"metadata":                   "metadata by short name",
	"168.63.129.16":              "Azure WireServer (VM agent, DHCP, DNS)",
	"fd00:ec2::253":              "AWS Route 53 Resolver over IPv6",
	"fd00:ec2::123":              "AWS Time Sync over IPv6",
	"fd00:ec2::23":               "AWS EKS Pod Identity Agent over IPv6",
	"fd20:ce::254":               "GCP metadata over IPv6",
	"fd00:42::42":                "Scaleway metadata over IPv6",
	"metadata.tencentyun.com":    "Tencent Cloud metadata by name",
	"api.metadata.cloud.ibm.com": "IBM Cloud VPC metadata by name",
}

// Floor lists the platform floor of o (nil: BaseOverlay()): every always-deny entry,
// which no sandbox policy overrides (the overlay is checked before the policy, in
// report mode too), then the special-address classes, which only an explicit IP/CIDR
// allow rule reaches. Overlay entries past BuiltinDeny are the operator's: egressd
// adds this host's addresses, `airlock up` the sandbox network's subnets, the cluster
// mode its pod, Service and node ranges, and egress.deny the rest.
func (o *Overlay) Floor() []FloorEntry {
	if o == nil {
		o = BaseOverlay()
	}
	var out []FloorEntry
	for i, r := range o.AlwaysDeny {
		e := FloorEntry{Rule: fmt.Sprintf("overlay.alwaysDeny[%d]", i), Target: r.Target, Source: "operator", Note: r.Comment}
		if i < len(BuiltinDeny) && BuiltinDeny[i] == r.Target {
			e.Source, e.Note = "built-in", builtinNotes[r.Target]
		}
		if len(r.Ports) > 0 || len(r.Protocols) > 0 {
			e.Target += " (" + scopeOf(r) + ")"
		}
		if e.Note == "" {
			e.Note = noteFor(r.Target)
		}
		out = append(out, e)
	}
	for _, p := range SpecialPrefixes() {
		out = append(out, FloorEntry{Rule: "guard", Target: p.String(), Source: "guard", Overridable: true,
			Note: string(Classify(p.Addr())) + " addresses"})
	}
	return out
}

// noteFor describes an operator entry by its target.
func noteFor(target string) string {
	if p, err := netip.ParsePrefix(target); err == nil {
		return string(Classify(p.Addr())) + " range (this host, the sandbox network or the cluster, or egress.deny)"
	}
	if a, err := netip.ParseAddr(target); err == nil {
		return string(Classify(a)) + " address (this host's, or egress.deny)"
	}
	return "name (egress.deny)"
}

func scopeOf(r Rule) string {
	var parts []string
	for _, p := range r.Protocols {
		parts = append(parts, string(p))
	}
	for _, p := range r.Ports {
		parts = append(parts, p.String())
	}
	return strings.Join(parts, " ")
}

// InFloor reports whether d is a denial by the platform floor (the operator overlay's
// always-deny list), which no policy rule can change.
func (d Decision) InFloor() bool {
	return d.Action == Deny && strings.HasPrefix(d.Rule, "overlay.alwaysDeny[")
}
