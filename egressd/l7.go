package egressd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/dnsfilter"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/policies"
)

// l7Proxy is the transparent L7 check of sandboxes whose policy says `l7: sni`: the
// datapath marks their TCP 80/443 that no static rule decided, the node's l7_redirect
// chain sends it here, and the proxy reads the TLS SNI (ClientHello, parsed by
// crypto/tls) or the HTTP Host header. The connection is spliced to its original
// destination (no TLS interception) only when the name is allowed by the policy AND the
// destination address was learned from a DNS answer for that name; otherwise it is
// closed (HTTP gets a 403 first). Under `l7: sni` plain HTTP is not spliced: every
// request of the connection is checked the same way (relayHTTP). Connections of
// credentialProxy sandboxes are decided by credentialProxy.decide instead where a vault
// binding or no `l7: sni` is involved. Every decision is audited (source l7).
// What the proxy never sees (other ports, UDP) is not granted to a name's learned
// addresses unless a rule names it (l7Scope).
type l7Proxy struct {
	d  *Daemon
	ln net.Listener
}

// l7SniffTimeout bounds the wait for the ClientHello or the request headers.
const l7SniffTimeout = 10 * time.Second

func newL7Proxy(d *Daemon, addr string) (*l7Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("egressd: l7 proxy: %w", err)
	}
	return &l7Proxy{d: d, ln: ln}, nil
}

func (p *l7Proxy) run(ctx context.Context) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go p.handle(ctx, c.(*net.TCPConn))
	}
}

// close stops accepting; spliced connections run until their ends close them.
func (p *l7Proxy) close() error { return p.ln.Close() }

func (p *l7Proxy) handle(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	d := p.d
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	dst, err := nftfilter.OriginalDst(c)
	if err != nil {
		d.log.Debug("l7: no original destination", "src", src, "err", err)
		return
	}
	sbx, ok := d.lookup(src.Addr())
	if !ok {
		return
	}
	var seen bytes.Buffer
	c.SetReadDeadline(time.Now().Add(l7SniffTimeout))
	name, isTLS, err := sniff(io.TeeReader(c, &seen))
	c.SetReadDeadline(time.Time{})
	proto := "http"
	if isTLS {
		proto = "https"
	}
	var (
		rec     audit.Record
		allowed bool
		handled bool
		ct      *credTarget        // the interception of this connection (vault or HTTP rules)
		rules   *policies.HTTPHost // the host's HTTP rules (nil: none)
	)
	if d.cred != nil {
		rec = audit.Record{Time: time.Now(), SandboxID: sbx.ID, Source: audit.SourceL7, Src: src.String(),
			DstIP: dst.Addr().String(), DstPort: int(dst.Port()), Mode: string(sbx.Policy.Mode()),
			PolicyVersion: sbx.Policy.Version(), Proto: proto, DstHost: name}
		ct, allowed, handled = d.cred.decide(sbx, name, isTLS, err, src, dst, &rec)
	}
	if handled {
		rec.Action = string(policies.Deny)
		if allowed {
			rec.Action = string(policies.Allow)
		}
	} else {
		checked := name
		if err != nil {
			checked = ""
		}
		rec, rules, allowed = d.decideL7(sbx, src, dst, checked, proto)
		if allowed && rules != nil && isTLS {
			// The host has HTTP rules: its requests are read, so TLS is terminated.
			if d.cred == nil {
				allowed, rec.Action, rec.Rule = false, string(policies.Deny), "l7"
				rec.Reason = fmt.Sprintf("%s has HTTP rules, which need TLS interception, and this egressd has no interception CA (Credential Vault)", name)
			} else {
				ct = &credTarget{sandbox: sbx.ID, host: policies.NormalizeName(name), dst: dst, src: src.String(),
					http: rules, policyOnly: true}
				rec.Reason += "; intercepted: each request is checked against the host's HTTP rules"
			}
		}
	}
	if d.cfg.Audit != nil {
		d.cfg.Audit.Append(rec)
	}
	if !allowed {
		if !isTLS && err == nil {
			io.WriteString(c, l7Forbidden)
		}
		return
	}
	if ct != nil {
		d.cred.serve(c, seen.Bytes(), *ct, isTLS)
		return
	}
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	up, err := dialer.DialContext(dctx, "tcp", dst.String())
	cancel()
	if err != nil {
		d.log.Debug("l7: upstream dial failed", "sandbox_id", sbx.ID, "dst", dst, "err", err)
		return
	}
	defer up.Close()
	if !isTLS && sbx.Policy.L7() == policies.L7SNI {
		// Every request of the connection is checked, not only the first. (A sandbox
		// here only for its Credential Vault, l7 off, is held to its addresses.)
		p.relayHTTP(c, up.(*net.TCPConn), seen.Bytes(), src, dst, name, rules)
		return
	}
	if _, err := up.Write(seen.Bytes()); err != nil {
		return
	}
	splice(c, up.(*net.TCPConn))
}

// l7Forbidden is the answer to a refused HTTP request; the connection closes after it.
const l7Forbidden = "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 30\r\n\r\nblocked by the egress policy\r\n"

// decideL7 decides name (a TLS SNI or an HTTP Host; "" when the connection gave none)
// on a connection of sandbox sbx from src to dst over proto ("http" or "https"): the
// name must be allowed by the policy at dst's port AND dst must have been learned from
// a DNS answer for it. It returns the decision's audit record (source l7), the host's
// HTTP rules when the deciding rule has some (every request must then pass them), and
// whether the name is allowed.
func (d *Daemon) decideL7(sbx dnsfilter.Sandbox, src, dst netip.AddrPort, name, proto string) (audit.Record, *policies.HTTPHost, bool) {
	rec := audit.Record{Time: time.Now(), SandboxID: sbx.ID, Source: audit.SourceL7, Src: src.String(),
		DstIP: dst.Addr().String(), DstPort: int(dst.Port()), Mode: string(sbx.Policy.Mode()),
		PolicyVersion: sbx.Policy.Version(), Proto: proto, DstHost: name, Action: string(policies.Deny)}
	if name == "" {
		rec.Rule, rec.Reason = "l7", "no TLS SNI or HTTP Host to check"
		return rec, nil, false
	}
	dec := sbx.Policy.DecideName(name, dst.Port(), policies.TCP)
	rec.Rule, rec.Reason, rec.WouldDeny = dec.Rule, dec.Reason, dec.WouldDeny // audit mode: passes, would_deny
	switch {
	case !dec.Allowed():
		return rec, nil, false
	case !d.learnedFor(sbx.ID, dst.Addr(), name):
		rec.Rule, rec.Reason = "l7", fmt.Sprintf("%s was not learned from a DNS answer for %s", dst.Addr(), name)
		return rec, nil, false
	}
	rec.Action = string(policies.Allow)
	return rec, dec.HTTP, true
}

// splice copies both ways until both directions are done, half-closing each side as
// its peer finishes.
func splice(a, b *net.TCPConn) {
	var wg sync.WaitGroup
	cp := func(dst, src *net.TCPConn) {
		io.Copy(dst, src)
		dst.CloseWrite()
	}
	wg.Go(func() { cp(b, a) })
	cp(a, b)
	wg.Wait()
}

// learnedFor reports whether addr was learned from a DNS answer for name (or a name
// whose CNAME chain it was) for sandbox id, and has not expired.
func (d *Daemon) learnedFor(id string, addr netip.Addr, name string) bool {
	name = policies.NormalizeName(name)
	d.mu.RLock()
	defer d.mu.RUnlock()
	sb := d.byID[id]
	if sb == nil {
		return false
	}
	l, ok := sb.learned[addr.Unmap()]
	if !ok || time.Now().After(l.until) {
		return false
	}
	for _, n := range l.names {
		if n == name {
			return true
		}
	}
	return false
}

// errSniffed stops the TLS handshake once the ClientHello has been read.
var errSniffed = errors.New("client hello read")

// sniff reads the start of a connection: a TLS ClientHello (first byte 0x16) gives its
// SNI, anything else is read as an HTTP/1 request whose Host is returned.
func sniff(r io.Reader) (name string, isTLS bool, err error) {
	br := bufio.NewReader(r)
	first, err := br.Peek(1)
	if err != nil {
		return "", false, err
	}
	if first[0] == 0x16 {
		var sni string
		err := tls.Server(sniffConn{r: br}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errSniffed
		}}).Handshake()
		if sni == "" && !errors.Is(err, errSniffed) {
			return "", true, err
		}
		return sni, true, nil
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return "", false, err
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(host, "."), false, nil
}

// sniffConn is the read-only net.Conn crypto/tls parses the ClientHello from; its
// writes (the alert after errSniffed) go nowhere.
type sniffConn struct{ r io.Reader }

func (c sniffConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (sniffConn) Write(p []byte) (int, error)      { return len(p), nil }
func (sniffConn) Close() error                     { return nil }
func (sniffConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (sniffConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (sniffConn) SetDeadline(time.Time) error      { return nil }
func (sniffConn) SetReadDeadline(time.Time) error  { return nil }
func (sniffConn) SetWriteDeadline(time.Time) error { return nil }
