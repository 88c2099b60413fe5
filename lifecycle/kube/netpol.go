package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/airlockdev/airlock/lifecycle"
)

// NonPublic are the prefixes a by-name allow does not open in the NetworkPolicy: the
// private, shared (CGNAT), link-local (cloud metadata) and loopback ranges, where the
// cluster's and the nodes' own networks live. egressd decides which names are allowed.
var NonPublic = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("::1/128"),
}

// kubeDNS is where pods without Config.DNS resolve (the cluster's DNS), admitted on
// port 53 only.
var kubeDNS = networkingv1.NetworkPolicyPeer{
	NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "kube-system"}},
	PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
}

// networkPolicy selects sandbox id's pod and admits:
//   - ingress only from the gateway and lifecycle pods of SystemNamespace (any port:
//     the gateway reaches user ports, lifecycle's proxy execd and user ports);
//   - egress on UDP and TCP 53 to the DNS addresses (Config.DNS, else kube-dns), and
//     on TCP Config.L7Port there (egressd's L7 proxy) when set with Config.DNS;
//   - egress by eg: AllowAll → everything; ByName → every address but NonPublic
//     (egressd enforces the names); plus exactly eg.CIDRs; each but Config.Deny
//     (allowBlock), so that the NetworkPolicy alone keeps a sandbox from the
//     cluster's pods, Services and nodes when the node's egressd is not running.
//
// An empty eg admits no egress but DNS.
func (r *Runtime) networkPolicy(id string, eg lifecycle.Egress) *networkingv1.NetworkPolicy {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	system := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: r.cfg.SystemNamespace}}
	from := func(sel map[string]string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{
			NamespaceSelector: system.DeepCopy(),
			PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(sel)},
		}
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PodName(id), Namespace: r.cfg.Namespace, Labels: r.labels(id)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandboxID: id}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{from(r.cfg.GatewaySelector), from(r.cfg.LifecycleSelector)},
			}},
		},
	}
	dnsPeers := []networkingv1.NetworkPolicyPeer{kubeDNS}
	if len(r.cfg.DNS) > 0 {
		dnsPeers = nil
		for _, a := range r.cfg.DNS {
			dnsPeers = append(dnsPeers, ipBlock(netip.PrefixFrom(a, a.BitLen())))
		}
	}
	ports := []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}
	if len(r.cfg.DNS) > 0 && r.cfg.L7Port != 0 {
		// egressd's L7 proxy, where the node redirects the sandbox's checked TCP 80/443.
		l7 := intstr.FromInt32(int32(r.cfg.L7Port))
		ports = append(ports, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &l7})
	}
	np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: dnsPeers, Ports: ports})
	var peers []networkingv1.NetworkPolicyPeer
	if eg.AllowAll && len(r.cfg.Deny) == 0 {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
		return np
	}
	if eg.AllowAll || eg.ByName {
		for _, all := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			var except []netip.Prefix
			if eg.ByName {
				except = NonPublic
			}
			if b := r.allowBlock(all, except); b != nil {
				peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: b})
			}
		}
	}
	for _, p := range eg.CIDRs {
		if eg.AllowAll {
			break // inside the blocks above already
		}
		if b := r.allowBlock(p, nil); b != nil {
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: b})
		}
	}
	if len(peers) > 0 {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers})
	}
	return np
}

// allowBlock is the ipBlock admitting p but the prefixes of except and Config.Deny
// inside it (of p's family, each once, outermost only), or nil when a deny covers p
// entirely (a NetworkPolicy's except must lie strictly inside its cidr).
func (r *Runtime) allowBlock(p netip.Prefix, except []netip.Prefix) *networkingv1.IPBlock {
	p = p.Masked()
	var out []netip.Prefix
	for _, d := range append(slices.Clone(except), r.cfg.Deny...) {
		d = d.Masked()
		if d.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		if d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
			return nil
		}
		if p.Contains(d.Addr()) && !slices.ContainsFunc(out, func(o netip.Prefix) bool { return o.Bits() <= d.Bits() && o.Contains(d.Addr()) }) {
			out = slices.DeleteFunc(out, func(o netip.Prefix) bool { return d.Contains(o.Addr()) && d.Bits() <= o.Bits() })
			out = append(out, d)
		}
	}
	b := &networkingv1.IPBlock{CIDR: p.String()}
	for _, d := range out {
		b.Except = append(b.Except, d.String())
	}
	return b
}

func ipBlock(p netip.Prefix) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.Masked().String()}}
}

// UpdateEgress rewrites the sandbox's NetworkPolicy for eg (creating it when it went
// missing, without owner: Remove deletes it by name).
func (r *Runtime) UpdateEgress(ctx context.Context, inst lifecycle.Instance, eg lifecycle.Egress) error {
	nps := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace)
	want := r.networkPolicy(inst.SandboxID, eg)
	// One round trip: a JSON patch replacing the whole spec (no read, no conflict).
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec", "value": want.Spec}})
	if err != nil {
		return fmt.Errorf("kube: encoding the NetworkPolicy of %s: %w", inst.SandboxID, err)
	}
	_, err = nps.Patch(ctx, want.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		if _, err = nps.Create(ctx, want, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = nps.Patch(ctx, want.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("kube: writing the NetworkPolicy of %s: %w", inst.SandboxID, err)
	}
	return nil
}

// MissingEgress returns those of ids whose pod runs (not being deleted: a sandbox
// another replica removes is left alone) but whose NetworkPolicy is missing (deleted by
// hand): one List of the namespace's pods and one of its NetworkPolicies of this instance.
func (r *Runtime) MissingEgress(ctx context.Context, ids []string) ([]string, error) {
	sel := metav1.ListOptions{LabelSelector: LabelInstance + "=" + r.cfg.Instance}
	pods, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("kube: listing pods: %w", err)
	}
	live := make(map[string]bool, len(pods.Items))
	for _, p := range pods.Items {
		live[p.Name] = p.DeletionTimestamp == nil
	}
	l, err := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("kube: listing NetworkPolicies: %w", err)
	}
	have := make(map[string]bool, len(l.Items))
	for _, np := range l.Items {
		have[np.Name] = true
	}
	var out []string
	for _, id := range ids {
		if live[PodName(id)] && !have[PodName(id)] {
			out = append(out, id)
		}
	}
	return out, nil
}
