package dnsfilter

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// ProtoProxy is the audit proto of queries made through Resolve.
const ProtoProxy = "proxy"

// Resolve answers a query for name and qtype exactly as if the sandbox at src had sent
// it: the same checks, cache and upstreams, answer filtering (CNAME hops, rebinding),
// learning hook and audit record (proto "proxy"). It is how egressd's explicit HTTP
// proxy resolves the hosts sandboxes ask it for, so that a name reached through the
// proxy obeys the policy exactly as one resolved by the sandbox does. It returns the
// answer message (check its Rcode); an error only when no answer was produced.
func (s *Server) Resolve(src netip.Addr, name string, qtype uint16) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	w := &captureWriter{remote: proxyAddr{netip.AddrPortFrom(src, 0)}}
	s.ServeDNS(w, q)
	if w.msg == nil {
		return nil, fmt.Errorf("dnsfilter: no answer for %s", name)
	}
	return w.msg, nil
}

// proxyAddr is the remote address of a Resolve query.
type proxyAddr struct{ ap netip.AddrPort }

func (a proxyAddr) Network() string { return ProtoProxy }
func (a proxyAddr) String() string  { return a.ap.String() }

// captureWriter is the dns.ResponseWriter of a Resolve query: it keeps the answer.
type captureWriter struct {
	remote net.Addr
	msg    *dns.Msg
}

func (w *captureWriter) LocalAddr() net.Addr       { return proxyAddr{} }
func (w *captureWriter) RemoteAddr() net.Addr      { return w.remote }
func (w *captureWriter) WriteMsg(m *dns.Msg) error { w.msg = m; return nil }
func (w *captureWriter) Write(b []byte) (int, error) {
	return 0, fmt.Errorf("dnsfilter: raw write on a proxy query")
}
func (w *captureWriter) Close() error        { return nil }
func (w *captureWriter) TsigStatus() error   { return nil }
func (w *captureWriter) TsigTimersOnly(bool) {}
func (w *captureWriter) Hijack()             {}
