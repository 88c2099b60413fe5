package egressd

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/datapath"
	"github.com/airlockdev/airlock/policies"
)

// PlainHTTPMode is the operator's setting vault.plainHTTP (airlock.yaml; `airlock
// egressd --vault-plain-http`): to which addresses a plain-HTTP request for a bound host
// may carry a credential. Over TLS the upstream certificate proves the name whatever
// address the sandbox chose; over plain HTTP nothing does.
type PlainHTTPMode string

const (
	// PlainHTTPLearned (the default, also for ""): only to an address learned from a
	// DNS answer for the bound name. A plain-HTTP connection to another address the
	// policy allows is forwarded without a credential.
	PlainHTTPLearned PlainHTTPMode = "learned"
	// PlainHTTPPolicy: to any address the sandbox's policy accepts for the bound name
	// (as if a DNS answer had given it: overlay, explicit IP rules, special-address
	// guard), including one the sandbox chose itself (curl --resolve, /etc/hosts).
	// Whoever controls that address, or the path to it, reads the secret: OSEP-0012
	// puts port-80 injection behind an operator setting for the same reason.
	PlainHTTPPolicy PlainHTTPMode = "policy"
)

// ParsePlainHTTPMode checks a vault.plainHTTP value ("" is PlainHTTPLearned).
func ParsePlainHTTPMode(s string) (PlainHTTPMode, error) {
	switch m := PlainHTTPMode(s); m {
	case "":
		return PlainHTTPLearned, nil
	case PlainHTTPLearned, PlainHTTPPolicy:
		return m, nil
	}
	return "", fmt.Errorf("vault.plainHTTP %q: want learned or policy", s)
}

// credentialSandbox reports whether sandbox id was created with credentialProxy.enabled.
func (d *Daemon) credentialSandbox(id string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	sb := d.byID[id]
	return sb != nil && sb.view.CredentialProxy
}

// decide is the L7 proxy's verdict on a connection of a credentialProxy sandbox, given
// its sniffed name (TLS SNI or HTTP Host; sniffErr when neither could be read). It
// fills rec's rule and reason. handled false leaves the decision to the L7 check of an
// `l7: sni` policy (no binding is involved). Otherwise allowed says whether the
// connection goes on, and t, when not nil, is the interception it gets:
//
//   - a binding matches the name, scheme and port: the name must be allowed. An address
//     learned from DNS for the name gets the credential. Over TLS so does any address
//     the policy accepts for the name (policies.Decider.DecideLearned): the upstream's
//     certificate is verified against the name, so a server that cannot prove it is
//     that host never sees the secret. Plain HTTP to such an address gets it only under
//     PlainHTTPPolicy; otherwise its requests are forwarded without a credential
//     (audited "not injected: address not learned") when the policy allows the flow.
//   - no binding: the flow follows the network policy as the datapath would decide it
//     without the proxy (the `l7: sni` check when the policy asks for it; else a live
//     learned grant for the port, else DecideAddr), and is spliced.
func (cp *credentialProxy) decide(sbx dnsfilter.Sandbox, name string, isTLS bool, sniffErr error,
	src, dst netip.AddrPort, rec *audit.Record) (t *credTarget, allowed, handled bool) {
	d := cp.d
	if !d.credentialSandbox(sbx.ID) {
		return nil, false, false
	}
	pol, port := sbx.Policy, dst.Port()
	scheme := "http"
	if isTLS {
		scheme = "https"
	}
	host := policies.NormalizeName(name)
	if sniffErr != nil || host == "" || !d.cfg.Vault.Intercepts(sbx.ID, scheme, host, port) {
		if pol.L7() == policies.L7SNI {
			return nil, false, false
		}
		dec := d.decideFlow(sbx, dst)
		rec.Rule, rec.Reason, rec.WouldDeny = dec.Rule, dec.Reason, dec.WouldDeny
		return nil, dec.Allowed(), true
	}
	dec := pol.DecideName(host, port, policies.TCP)
	rec.Rule, rec.Reason, rec.WouldDeny = dec.Rule, dec.Reason, dec.WouldDeny
	if !dec.Allowed() {
		return nil, false, true
	}
	t = &credTarget{sandbox: sbx.ID, host: host, dst: dst, src: src.String(), http: dec.HTTP}
	if d.learnedFor(sbx.ID, dst.Addr(), host) {
		return t, true, true
	}
	learned := pol.DecideLearned(host, dst.Addr().Unmap(), port, policies.TCP)
	if !learned.Allowed() {
		rec.Rule, rec.Reason = learned.Rule, learned.Reason
		return nil, false, true
	}
	t.chosen = true
	switch {
	case isTLS:
		rec.Reason = fmt.Sprintf("%s (%s chosen by the sandbox; the upstream certificate must prove %s)", dec.Reason, dst.Addr(), host)
		return t, true, true
	case cp.plainHTTP == PlainHTTPPolicy:
		rec.Reason = fmt.Sprintf("%s (%s chosen by the sandbox; vault.plainHTTP: policy)", dec.Reason, dst.Addr())
		return t, true, true
	}
	// Plain HTTP to an address not learned for the name: no credential, and the flow
	// is the network policy's to decide, as without a binding.
	flow := policies.Decision{Action: policies.Deny, Rule: "l7",
		Reason: fmt.Sprintf("%s was not learned from a DNS answer for %s", dst.Addr(), host)}
	if pol.L7() != policies.L7SNI {
		flow = d.decideFlow(sbx, dst)
	}
	rec.Rule, rec.Reason = flow.Rule, flow.Reason
	if !flow.Allowed() {
		return nil, false, true
	}
	rec.Reason += fmt.Sprintf("; not injected: %s was not learned from a DNS answer for %s (vault.plainHTTP: learned)", dst.Addr(), host)
	t.chosen = false
	t.noInject = fmt.Sprintf("not injected: address not learned (%s was not learned from a DNS answer for %s; vault.plainHTTP: learned)", dst.Addr(), host)
	return t, true, true
}

// decideFlow decides TCP to dst as the datapath does for what no static rule decided
// (datapath package documentation, steps 8 and 9): a live learned grant covering the
// port allows it, else the policy's address decision (its default).
func (d *Daemon) decideFlow(sbx dnsfilter.Sandbox, dst netip.AddrPort) policies.Decision {
	a := dst.Addr().Unmap()
	d.mu.RLock()
	var l learnedAddr
	var ok bool
	if sb := d.byID[sbx.ID]; sb != nil {
		l, ok = sb.learned[a]
	}
	d.mu.RUnlock()
	if ok && time.Now().Before(l.until) && (l.every || slices.ContainsFunc(l.grants, func(g datapath.ProtoPorts) bool {
		lo, hi := g.Ports.Bounds()
		return g.Proto == datapath.ProtoTCP && lo <= dst.Port() && dst.Port() <= hi
	})) {
		return policies.Decision{Action: policies.Allow, Mode: sbx.Policy.Mode(), Rule: "learned",
			Reason: fmt.Sprintf("%s was learned from a DNS answer", a), Version: sbx.Policy.Version()}
	}
	return sbx.Policy.DecideAddr(a, dst.Port(), policies.TCP)
}
