package egressd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// explicitProxy is the HTTP proxy sandboxes use through HTTP_PROXY / HTTPS_PROXY
// (Config.ProxyPort), built on goproxy. It serves CONNECT (tunnels, no TLS
// interception) and absolute-URI http:// requests. Every request is decided by the
// sandbox's policy exactly as a direct connection is: the sandbox is the client's
// source address; a name must be allowed for the port (policies.Decider.DecideName),
// is resolved through the DNS filter as if the sandbox had asked (same cache,
// rebinding filter, learning and audit: dnsfilter.Server.Resolve), and the address
// dialled must pass DecideLearned; an address literal must pass DecideAddr. Denials
// answer 403 with a JSON {code, message}; every decision is audited (source l7,
// extra.proxy "explicit").
type explicitProxy struct {
	d   *Daemon
	ln  net.Listener
	srv *http.Server
}

// proxyDialTimeout bounds the upstream dial of a proxied request.
const proxyDialTimeout = 10 * time.Second

func newExplicitProxy(d *Daemon, addr string) (*explicitProxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("egressd: explicit proxy: %w", err)
	}
	p := &explicitProxy{d: d, ln: ln}
	dialer := &net.Dialer{Timeout: proxyDialTimeout}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = proxyLogger{d}
	// Never a proxy of the host's own environment: the proxy dials what it decided.
	gp.Tr = &http.Transport{
		DialContext: dialer.DialContext, TLSHandshakeTimeout: proxyDialTimeout,
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second,
	}
	gp.ConnectDial = nil
	gp.ConnectDialWithReq = func(r *http.Request, network, addr string) (net.Conn, error) {
		return dialer.DialContext(r.Context(), network, addr)
	}
	gp.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "BAD_PROXY_REQUEST",
			Message: "this is the egress proxy: send absolute http:// URLs or CONNECT host:port (HTTP_PROXY / HTTPS_PROXY)"})
	})
	gp.OnRequest().HandleConnectFunc(p.connect)
	gp.OnRequest().DoFunc(p.request)
	p.srv = &http.Server{Handler: gp, ReadHeaderTimeout: l7SniffTimeout}
	return p, nil
}

func (p *explicitProxy) run(context.Context) {
	if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		p.d.log.Error("explicit proxy stopped", "err", err)
	}
}

// close stops accepting; established tunnels run until their ends close them.
func (p *explicitProxy) close() error { return p.srv.Close() }

// addr is the bound address.
func (p *explicitProxy) addr() netip.AddrPort {
	ap, _ := netip.ParseAddrPort(p.ln.Addr().String())
	return ap
}

// connect decides a CONNECT host:port; an allowed tunnel is dialled to the address the
// decision chose, never to a name the proxy would resolve on its own.
func (p *explicitProxy) connect(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	v := p.decide(ctx.Req, host, 443, "https")
	if !v.ok {
		ctx.Resp = v.response(ctx.Req)
		return goproxy.RejectConnect, host
	}
	return &goproxy.ConnectAction{Action: goproxy.ConnectAccept}, v.dst.String()
}

// request decides an absolute-URI request; an allowed one is sent to the chosen
// address with its Host header unchanged.
func (p *explicitProxy) request(r *http.Request, _ *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	if r.URL.Scheme != "http" {
		v := verdict{status: http.StatusBadRequest, code: "BAD_PROXY_REQUEST",
			reason: "only http:// URLs are proxied as requests; reach https:// through CONNECT (HTTPS_PROXY)"}
		return r, v.response(r)
	}
	v := p.decide(r, r.URL.Host, 80, "http")
	if !v.ok {
		return r, v.response(r)
	}
	if v.rules != nil {
		base := audit.Record{SandboxID: v.sandbox, Source: audit.SourceL7, Src: r.RemoteAddr, DstHost: v.host,
			DstIP: v.dst.Addr().String(), DstPort: int(v.dst.Port()), Proto: "http"}
		rec, dec := checkRequest(v.rules, r, base, nil)
		rec.Extra["proxy"] = "explicit"
		if p.d.cfg.Audit != nil {
			p.d.cfg.Audit.Append(rec)
		}
		if !dec.Allowed() {
			return r, deniedResponse(r, v.host, dec)
		}
	}
	if r.Host == "" {
		r.Host = r.URL.Host
	}
	r.URL.Host = v.dst.String()
	return r, nil
}

// verdict is the outcome of one proxy decision.
type verdict struct {
	ok  bool
	dst netip.AddrPort
	// rules are the host's HTTP rules (nil: none), sandbox and host what was decided.
	rules         *policies.HTTPHost
	sandbox, host string
	status        int
	code          string
	reason        string
}

// response is a refused verdict's answer: the JSON error envelope
// (opensandbox.ErrorBody).
func (v verdict) response(r *http.Request) *http.Response {
	b, _ := json.Marshal(opensandbox.ErrorBody{Code: v.code, Message: v.reason})
	return goproxy.NewResponse(r, "application/json", v.status, string(b)+"\n")
}

// decide applies the policy of the sandbox at r's source address to hostport (default
// port def) and audits the decision.
func (p *explicitProxy) decide(r *http.Request, hostport string, def uint16, proto string) verdict {
	d := p.d
	src, _ := netip.ParseAddrPort(r.RemoteAddr)
	sbx, known := d.lookup(src.Addr().Unmap())
	rec := audit.Record{Time: time.Now(), Source: audit.SourceL7, Proto: proto, Src: src.String(),
		Extra: map[string]any{"proxy": "explicit"}}
	host, port, err := splitHostPort(hostport, def)
	rec.DstPort = int(port)
	deny := func(status int, code string, dec policies.Decision) verdict {
		rec.Action, rec.Rule, rec.Reason = string(policies.Deny), dec.Rule, dec.Reason
		if d.cfg.Audit != nil {
			d.cfg.Audit.Append(rec)
		}
		return verdict{status: status, code: code, reason: dec.Reason}
	}
	if !known || sbx.Policy == nil {
		return deny(http.StatusForbidden, "EGRESS_DENIED", policies.Decision{Reason: "source is not a sandbox of this node"})
	}
	pol := sbx.Policy
	rec.SandboxID, rec.Mode, rec.PolicyVersion = sbx.ID, string(pol.Mode()), pol.Version()
	if err != nil {
		rec.DstHost = hostport
		return deny(http.StatusBadRequest, "BAD_PROXY_REQUEST", policies.Decision{Rule: "proxy", Reason: err.Error()})
	}
	var dec policies.Decision
	var dst netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		dst = a.Unmap()
		rec.DstIP = dst.String()
		dec = pol.DecideAddr(dst, port, policies.TCP)
	} else {
		rec.DstHost = policies.NormalizeName(host)
		if dec = pol.DecideName(host, port, policies.TCP); !dec.Allowed() {
			return deny(http.StatusForbidden, "EGRESS_DENIED", dec)
		}
		if dst, err = p.resolve(src.Addr().Unmap(), host); err != nil {
			return deny(http.StatusBadGateway, "UPSTREAM_UNRESOLVED", policies.Decision{Rule: dec.Rule, Reason: err.Error()})
		}
		rec.DstIP = dst.String()
		if learned := pol.DecideLearned(host, dst, port, policies.TCP); !learned.Allowed() {
			dec = learned
		}
	}
	if !dec.Allowed() {
		return deny(http.StatusForbidden, "EGRESS_DENIED", dec)
	}
	// The proxy dials from the host, where the sandbox network's isolation between
	// sandboxes does not apply: a sandbox's address is never a destination, whatever
	// the policy allows (the operator overlay denies the sandbox subnets as well).
	if _, isSandbox := d.lookup(dst); isSandbox {
		return deny(http.StatusForbidden, "EGRESS_DENIED", policies.Decision{Rule: "proxy",
			Reason: "the destination is a sandbox: sandboxes never reach each other"})
	}
	if dec.HTTP != nil && proto == "https" {
		// The host's HTTP rules must see each request; a CONNECT tunnel hides them.
		return deny(http.StatusForbidden, "EGRESS_DENIED", policies.Decision{Rule: dec.Rule,
			Reason: fmt.Sprintf("%s has HTTP rules, which cannot be checked inside a CONNECT tunnel: reach it without the proxy (its requests are checked there)", rec.DstHost)})
	}
	rec.Action, rec.Rule, rec.Reason, rec.WouldDeny = string(policies.Allow), dec.Rule, dec.Reason, dec.WouldDeny
	if d.cfg.Audit != nil && pol.ShouldAudit(dec) {
		d.cfg.Audit.Append(rec)
	}
	return verdict{ok: true, dst: netip.AddrPortFrom(dst, port), rules: dec.HTTP, sandbox: sbx.ID, host: rec.DstHost}
}

// resolve asks the DNS filter for host's IPv4 then IPv6 addresses as the sandbox at
// src, and returns the first address of the filtered answer.
func (p *explicitProxy) resolve(src netip.Addr, host string) (netip.Addr, error) {
	rcode := dns.RcodeSuccess
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m, err := p.d.dns.Resolve(src, host, qt)
		if err != nil {
			return netip.Addr{}, err
		}
		rcode = m.Rcode
		for _, rr := range m.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				if a, ok := netip.AddrFromSlice(rr.A); ok {
					return a.Unmap(), nil
				}
			case *dns.AAAA:
				if a, ok := netip.AddrFromSlice(rr.AAAA); ok {
					return a, nil
				}
			}
		}
		if rcode != dns.RcodeSuccess {
			break
		}
	}
	return netip.Addr{}, fmt.Errorf("%s did not resolve to an allowed address (%s)", host, dns.RcodeToString[rcode])
}

// splitHostPort splits "host[:port]" (IPv6 literals in brackets), applying def.
func splitHostPort(hostport string, def uint16) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		host, ps = strings.Trim(hostport, "[]"), ""
	}
	if host == "" {
		return "", 0, fmt.Errorf("no host in %q", hostport)
	}
	if ps == "" {
		return host, def, nil
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	return host, uint16(n), nil
}

// proxyLogger sends goproxy's (verbose-only and warning) lines to the debug log.
type proxyLogger struct{ d *Daemon }

func (l proxyLogger) Printf(format string, v ...any) {
	l.d.log.Debug("explicit proxy: " + strings.TrimSpace(fmt.Sprintf(format, v...)))
}
