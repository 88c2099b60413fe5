package policies

import (
	"fmt"
	"net/netip"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Overlay is the operator's layer above every sandbox policy. AlwaysDeny is checked
// first, then AlwaysAllow, then the sandbox's rules: a sandbox policy can neither reach
// what AlwaysDeny lists nor lose what AlwaysAllow lists. Overlay decisions are enforced
// even when the sandbox policy is in report mode. A rule's Action is ignored (the list
// decides it).
//
// YAML/JSON form (ParseOverlay), each item a target string or a rule mapping:
//
//	alwaysDeny:
//	  - 169.254.169.254
//	  - {target: "*.internal.example.com", ports: [443]}
//	alwaysAllow:
//	  - {target: mirror.internal, ports: [443], comment: package mirror}
type Overlay struct {
	AlwaysDeny  []Rule `json:"alwaysDeny,omitempty"`
	AlwaysAllow []Rule `json:"alwaysAllow,omitempty"`
}

// BuiltinDeny is what BaseOverlay denies: cloud provider control endpoints (instance
// metadata and credentials, the platform's agent and DNS channels), link-local, loopback
// and unspecified addresses, localhost names. Egressd adds the host's own addresses and
// the control plane's. New entries go at the end, so that the rule references of the
// existing ones ("overlay.alwaysDeny[0]") stay what audit consumers have seen.
//
// Link-local 169.254.0.0/16 covers, besides 169.254.169.254, the AWS Time Sync Service
// (169.254.169.123), Route 53 Resolver (169.254.169.253), ECS task metadata
// (169.254.170.2), EKS Pod Identity (169.254.170.23), Tencent Cloud metadata
// (169.254.0.23) and Scaleway metadata (169.254.42.42). The IPv6 endpoints sit in
// unique-local space (fc00::/7), which the special-address guard already keeps from
// catch-alls; listing them here denies them against an explicit allow too.
var BuiltinDeny = []string{
	// Instance metadata of AWS, GCP, Azure, Oracle Cloud, DigitalOcean, IBM Cloud,
	// Hetzner, OpenStack.
	"169.254.169.254",
	// AWS IMDS over IPv6 (Nitro instances):
	// https://docs.aws.amazon.com/whitepapers/latest/ipv6-on-aws/supporting-amazon-vpc-services.html
	"fd00:ec2::254",
	// Alibaba Cloud metadata:
	// https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata
	"100.100.100.200",
	"169.254.0.0/16",
	"fe80::/10",
	"127.0.0.0/8",
	"::1",
	"0.0.0.0/8",
	"::",
	"localhost",
	"*.localhost",
	"metadata.google.internal",
	"metadata",
	// Azure WireServer, a public address: VM agent and extensions channel, DHCP, DNS,
	// load balancer probes:
	// https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16
	"168.63.129.16",
	// AWS Route 53 Resolver and Time Sync Service over IPv6:
	// https://docs.aws.amazon.com/whitepapers/latest/ipv6-on-aws/supporting-amazon-vpc-services.html
	"fd00:ec2::253",
	"fd00:ec2::123",
	// AWS EKS Pod Identity Agent over IPv6 (pod credentials):
	// https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html
	"fd00:ec2::23",
	// GCP metadata server over IPv6 (IPv6-only instances):
	// https://cloud.google.com/compute/docs/metadata/querying-metadata
	"fd20:ce::254",
	// Scaleway metadata over IPv6:
	// https://www.scaleway.com/en/developers/api/instance/user-data
	"fd00:42::42",
	// Tencent Cloud metadata by name (169.254.0.23):
	// https://www.tencentcloud.com/document/product/213/4934
	"metadata.tencentyun.com",
	// IBM Cloud VPC metadata and identity tokens by name (169.254.169.254):
	// https://cloud.ibm.com/apidocs/vpc-metadata
	"api.metadata.cloud.ibm.com",
}

// BaseOverlay returns a new overlay denying BuiltinDeny.
func BaseOverlay() *Overlay {
	o := &Overlay{}
	if err := o.Deny(BuiltinDeny...); err != nil {
		panic(err) // BuiltinDeny is valid by construction; the tests check it
	}
	return o
}

// Deny appends targets to AlwaysDeny. A target that ParseTarget rejects is an error and
// nothing is appended.
func (o *Overlay) Deny(targets ...string) error {
	rs, err := targetRules(Deny, targets)
	if err == nil {
		o.AlwaysDeny = append(o.AlwaysDeny, rs...)
	}
	return err
}

// Allow appends targets to AlwaysAllow, like Deny.
func (o *Overlay) Allow(targets ...string) error {
	rs, err := targetRules(Allow, targets)
	if err == nil {
		o.AlwaysAllow = append(o.AlwaysAllow, rs...)
	}
	return err
}

// DenyAddrs appends host addresses (or prefixes) to AlwaysDeny.
func (o *Overlay) DenyAddrs(addrs ...netip.Addr) {
	for _, a := range addrs {
		o.AlwaysDeny = append(o.AlwaysDeny, Rule{Action: Deny, Target: a.WithZone("").String()})
	}
}

// Clone returns a deep copy (nil for nil).
func (o *Overlay) Clone() *Overlay {
	if o == nil {
		return nil
	}
	p := &Policy{Egress: o.AlwaysDeny}
	q := &Policy{Egress: o.AlwaysAllow}
	return &Overlay{AlwaysDeny: p.Clone().Egress, AlwaysAllow: q.Clone().Egress}
}

func targetRules(a Action, targets []string) ([]Rule, error) {
	out := make([]Rule, 0, len(targets))
	for _, t := range targets {
		if _, err := ParseTarget(t); err != nil {
			return nil, fmt.Errorf("%w: overlay: %w", ErrInvalid, err)
		}
		out = append(out, Rule{Action: a, Target: t})
	}
	return out, nil
}

// ParseOverlay reads an overlay document (see Overlay), strictly like Parse.
func ParseOverlay(source string, data []byte) (*Overlay, error) {
	p := &parser{src: source}
	root, err := p.document(data)
	if err != nil {
		return nil, err
	}
	o := &Overlay{}
	list := func(a Action, dst *[]Rule) func(*yaml.Node, string) {
		return func(v *yaml.Node, path string) {
			p.list(v, path, func(_ int, v *yaml.Node, path string) {
				var r Rule
				if v.Kind == yaml.ScalarNode {
					s, ok := p.str(v, path)
					if !ok {
						return
					}
					if _, err := ParseTarget(s); err != nil {
						p.errorf(v, path, "%s", err)
					}
					r = Rule{Target: s, Line: v.Line, src: source}
				} else {
					r = p.rule(v, path, false)
					if r.Action != "" && r.Action != a {
						p.errorf(v, path, "action %q contradicts the list it is in", r.Action)
					}
				}
				r.Action = a
				*dst = append(*dst, r)
			})
		}
	}
	p.fields(root, "", map[string]func(*yaml.Node, string){
		"alwaysDeny":  list(Deny, &o.AlwaysDeny),
		"alwaysAllow": list(Allow, &o.AlwaysAllow),
	})
	if err := p.err(); err != nil {
		return nil, err
	}
	return o, nil
}

// Merge returns a new overlay with o's lists followed by other's.
func (o *Overlay) Merge(other *Overlay) *Overlay {
	out := o.Clone()
	if out == nil {
		out = &Overlay{}
	}
	if other != nil {
		c := other.Clone()
		out.AlwaysDeny = slices.Concat(out.AlwaysDeny, c.AlwaysDeny)
		out.AlwaysAllow = slices.Concat(out.AlwaysAllow, c.AlwaysAllow)
	}
	return out
}

// IsOverlayDocument reports whether data looks like an overlay document (a mapping whose
// keys include alwaysDeny or alwaysAllow), so tools can tell overlays from policies.
func IsOverlayDocument(data []byte) bool {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return false
	}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i].Value; k == "alwaysDeny" || k == "alwaysAllow" {
			return true
		}
	}
	return false
}
