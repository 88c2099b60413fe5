package egressd

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/httppath"
)

// CredentialVault is the Credential Vault (egressd/vault.Store) as the L7 proxy uses
// it. Intercepts and Match perform no I/O.
type CredentialVault interface {
	// Intercepts reports whether a binding of the sandbox matches scheme ("http" or
	// "https"), host and port: only then is the connection intercepted.
	Intercepts(sandboxID, scheme, host string, port uint16) bool
	// Match returns the headers to set on one request, and false when no binding
	// matches it.
	Match(sandboxID string, q vault.Request) (vault.Injection, bool)
	// CA is the sandbox's interception CA (the sandbox trusts its certificate).
	CA(sandboxID string) (*x509.Certificate, crypto.Signer, []byte, error)
}

// credentialProxy terminates the sandbox's HTTP(S) to destinations that have a
// binding (TLS with a leaf minted by the sandbox's CA for the checked name; which
// connections, and which of them may carry a credential: decide), and
// forwards each request through goproxy to the ORIGINAL destination address, with the
// binding's headers set (replacing the sandbox's own of the same names). Upstream TLS
// is verified against the system roots plus Config.UpstreamCAPEM. Every request is
// audited (source credential): injected (allow, rule = binding) or not (deny: no
// binding matches, so no credential). Values never reach a log or a record.
type credentialProxy struct {
	d         *Daemon
	mitm      *goproxy.ProxyHttpServer
	plainHTTP PlainHTTPMode // Config.VaultPlainHTTP, checked
	mu        sync.Mutex
	certs     map[string]*tls.Config // sandbox|host -> leaf; cleared when it grows past maxLeafCache
	// upstreamTLS verifies upstream certificates: system roots plus UpstreamCAPEM.
	upstreamTLS *tls.Config
}

const maxLeafCache = 4096

// credTarget is what one intercepted connection's requests are bound to.
type credTarget struct {
	sandbox string
	host    string // the name the L7 check allowed
	dst     netip.AddrPort
	src     string
	scheme  string
	// noInject, when set, is why no request of this connection gets a credential
	// (plain HTTP to an address not learned for host): each is forwarded and audited
	// with this reason.
	noInject string
	// chosen marks a connection to an address the sandbox chose (not learned for
	// host): the injection records say so.
	chosen bool
	// http, when set, are the host's HTTP rules: each request must pass them first.
	http *policies.HTTPHost
	// policyOnly marks an interception for the HTTP rules alone (no vault binding):
	// no credential is looked up or audited.
	policyOnly bool
	// upstream, set by serve, is this intercepted connection's own upstream transport
	// (keep-alive): see credentialProxy.upstreamFor.
	upstream *http.Transport
}

type credTargetKey struct{}

func newCredentialProxy(d *Daemon) (*credentialProxy, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if len(d.cfg.UpstreamCAPEM) > 0 && !roots.AppendCertsFromPEM(d.cfg.UpstreamCAPEM) {
		return nil, fmt.Errorf("egressd: UpstreamCAPEM holds no PEM certificate")
	}
	plain, err := ParsePlainHTTPMode(string(d.cfg.VaultPlainHTTP))
	if err != nil {
		return nil, fmt.Errorf("egressd: %w", err)
	}
	cp := &credentialProxy{d: d, certs: map[string]*tls.Config{}, plainHTTP: plain}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0) // goproxy's messages may quote requests
	cp.upstreamTLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	dialer := &net.Dialer{Timeout: proxyDialTimeout}
	// gp.Tr serves only a request without its connection's transport (none in serve):
	// one upstream connection per request, to the original destination.
	gp.Tr = &http.Transport{
		// The original destination, never a fresh lookup of the name.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			t, _ := ctx.Value(credTargetKey{}).(credTarget)
			if !t.dst.IsValid() {
				return nil, fmt.Errorf("no destination for this request")
			}
			return dialer.DialContext(ctx, "tcp", t.dst.String())
		},
		TLSClientConfig:     cp.upstreamTLS,
		TLSHandshakeTimeout: proxyDialTimeout,
		// A pool keyed by name alone would let one sandbox's request ride another
		// sandbox's connection.
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	gp.OnRequest().DoFunc(cp.inject)
	cp.mitm = gp
	return cp, nil
}

// inject sets the binding's headers on r, or records that none matched; the request
// goes upstream on its connection's own transport (credTarget.upstream).
func (cp *credentialProxy) inject(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	t, _ := r.Context().Value(credTargetKey{}).(credTarget)
	if t.upstream != nil {
		ctx.RoundTripper = goproxy.RoundTripperFunc(func(q *http.Request, _ *goproxy.ProxyCtx) (*http.Response, error) {
			return t.upstream.RoundTrip(q)
		})
	}
	if t.http != nil || t.policyOnly {
		if resp := cp.checkRules(r, t); resp != nil || t.policyOnly {
			return r, resp
		}
	}
	rec := audit.Record{Time: time.Now(), SandboxID: t.sandbox, Source: audit.SourceCredential, Src: t.src,
		DstHost: t.host, DstIP: t.dst.Addr().String(), DstPort: int(t.dst.Port()), Proto: t.scheme,
		Extra: map[string]any{"method": r.Method, "path": r.URL.Path}}
	defer func() {
		if cp.d.cfg.Audit != nil {
			cp.d.cfg.Audit.Append(rec)
		}
	}()
	if h := hostOnly(r.Host); h != t.host {
		// Another name inside a checked connection (domain fronting): refused.
		rec.Action, rec.Reason = "deny", fmt.Sprintf("Host %q is not the checked name %s", h, t.host)
		return r, goproxy.NewResponse(r, goproxy.ContentTypeText, http.StatusForbidden, "blocked by the egress policy: Host does not match the connection's name\n")
	}
	path, err := httppath.Canonical(r.URL.EscapedPath())
	if err != nil {
		// Servers resolve such a path in different ways: no binding may be judged on it.
		rec.Action, rec.Reason = "deny", err.Error()+": forwarded without a credential"
		return r, nil
	}
	inj, ok := cp.d.cfg.Vault.Match(t.sandbox, vault.Request{Scheme: t.scheme, Host: t.host, Port: t.dst.Port(), Method: r.Method, Path: path})
	if !ok {
		rec.Action, rec.Reason = "deny", fmt.Sprintf("no binding matches %s %s: forwarded without a credential", r.Method, r.URL.Path)
		return r, nil
	}
	if t.noInject != "" {
		rec.Action, rec.Rule, rec.Reason = "deny", inj.Binding, t.noInject+": forwarded without a credential"
		return r, nil
	}
	for _, h := range methodOverrides {
		r.Header.Del(h) // the binding matched r.Method; the upstream must act on it alone
	}
	for _, h := range inj.Headers {
		r.Header.Set(h.Name, h.Value) // replaces what the sandbox sent
	}
	rec.Action, rec.Rule, rec.Reason = "allow", inj.Binding, "credential injected by binding "+inj.Binding
	if t.chosen {
		rec.Reason += fmt.Sprintf(" to %s, an address the sandbox chose for %s", t.dst.Addr(), t.host)
	}
	return r, nil
}

// checkRules decides an intercepted request against the host's HTTP rules (t.http)
// and audits it (source l7); it returns the 403 answer of a refused request, else nil.
// A request naming another Host than the checked one is refused as in inject.
func (cp *credentialProxy) checkRules(r *http.Request, t credTarget) *http.Response {
	base := audit.Record{SandboxID: t.sandbox, Source: audit.SourceL7, Src: t.src, DstHost: t.host,
		DstIP: t.dst.Addr().String(), DstPort: int(t.dst.Port()), Proto: t.scheme}
	var rec audit.Record
	var dec policies.Decision
	if h := hostOnly(r.Host); h != t.host || t.http == nil {
		rec, dec = base, policies.Decision{Action: policies.Deny, Rule: "l7",
			Reason: fmt.Sprintf("Host %q is not the checked name %s", h, t.host)}
		rec.Time, rec.Action, rec.Rule, rec.Reason = time.Now(), string(dec.Action), dec.Rule, dec.Reason
		rec.Extra = map[string]any{"method": r.Method, "path": r.URL.Path}
		if t.http != nil {
			rec.Mode, rec.PolicyVersion = string(t.http.Mode()), t.http.Version()
		}
	} else {
		rec, dec = checkRequest(t.http, r, base, nil)
	}
	if cp.d.cfg.Audit != nil {
		cp.d.cfg.Audit.Append(rec)
	}
	if dec.Allowed() {
		return nil
	}
	return deniedResponse(r, t.host, dec)
}

// methodOverrides are the headers through which frameworks let a request name another
// method than its own; an injected request loses them.
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// serve handles one intercepted connection whose first bytes (the ClientHello or the
// request head) are replayed from seen.
func (cp *credentialProxy) serve(c net.Conn, seen []byte, t credTarget, isTLS bool) {
	var conn net.Conn = &replayConn{Conn: c, r: io.MultiReader(strings.NewReader(string(seen)), c)}
	t.scheme = "http"
	if isTLS {
		cfg, err := cp.leaf(t.sandbox, t.host)
		if err != nil {
			cp.d.log.Error("credential proxy: minting a certificate failed", "sandbox_id", t.sandbox, "host", t.host, "err", err)
			return
		}
		conn = tls.Server(conn, cfg)
		t.scheme = "https"
	}
	t.upstream = cp.upstreamFor(t)
	done := make(chan struct{})
	var closeOnce sync.Once
	var active sync.WaitGroup // handlers still running (a hijacked one outlives StateHijacked)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			active.Add(1)
			defer active.Done()
			if t.http != nil && !cp.streamsChecked(w, r, t) {
				return
			}
			r.URL.Scheme, r.URL.Host, r.RequestURI = t.scheme, net.JoinHostPort(t.host, fmt.Sprint(t.dst.Port())), ""
			if r.ProtoMajor == 2 {
				w = &h2Writer{ResponseWriter: w}
			}
			cp.mitm.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), credTargetKey{}, t)))
		}),
		ReadHeaderTimeout: l7SniffTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				closeOnce.Do(func() { close(done) })
			}
		},
	}
	go srv.Serve(&oneConnListener{conn: conn, done: done})
	<-done
	// The sandbox's connection is gone: so are its upstream connections, once the
	// last request (a WebSocket, say) has finished with them.
	go func() {
		active.Wait()
		t.upstream.CloseIdleConnections()
	}()
}

// Bounds of one intercepted connection's upstream pool. Over HTTP/1.1 the sandbox's
// connection carries one request at a time, so one idle connection is enough and the
// second absorbs a request that starts while the previous response is being closed;
// over HTTP/2 its concurrent streams open more upstream connections as they need.
const (
	upstreamIdleConns   = 2
	upstreamIdleTimeout = 90 * time.Second
)

// upstreamFor returns the upstream transport of one intercepted connection: keep-alive,
// so the connection's requests share upstream connections (one TLS handshake instead
// of one per request), and owned by that connection alone, so an upstream connection
// never carries two sandboxes' requests, or two client connections', or two names':
// every request of the connection names t.host (inject and checkRules refuse
// another Host) and every dial goes to t.dst, the address the sandbox dialled and the
// policy checked. Upstream TLS is verified per new connection against cp.upstreamTLS
// for t.host. serve closes its idle connections when the sandbox's connection closes;
// upstreamIdleTimeout bounds one left idle meanwhile.
func (cp *credentialProxy) upstreamFor(t credTarget) *http.Transport {
	dialer := &net.Dialer{Timeout: proxyDialTimeout}
	dst := t.dst.String()
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if !t.dst.IsValid() {
				return nil, fmt.Errorf("no destination for this request")
			}
			return dialer.DialContext(ctx, "tcp", dst)
		},
		TLSClientConfig:     cp.upstreamTLS,
		TLSHandshakeTimeout: proxyDialTimeout,
		MaxIdleConns:        upstreamIdleConns,
		MaxIdleConnsPerHost: upstreamIdleConns,
		IdleConnTimeout:     upstreamIdleTimeout,
		Proxy:               nil,
	}
}

// leaf returns the TLS config presenting a certificate for host signed by the
// sandbox's CA (goproxy's signer), cached per sandbox and host.
func (cp *credentialProxy) leaf(sandbox, host string) (*tls.Config, error) {
	key := sandbox + "|" + host
	cp.mu.Lock()
	cfg := cp.certs[key]
	cp.mu.Unlock()
	if cfg != nil {
		return cfg, nil
	}
	cert, signer, _, err := cp.d.cfg.Vault.CA(sandbox)
	if err != nil {
		return nil, err
	}
	ca := &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: signer, Leaf: cert}
	cfg, err = goproxy.TLSConfigFromCA(ca)(host, &goproxy.ProxyCtx{Proxy: cp.mitm})
	if err != nil {
		return nil, err
	}
	// HTTP/2 or HTTP/1.1, as the client prefers: over HTTP/2 every stream is a request
	// of its own to the handler, so each is checked (HTTP rules) and injected alone;
	// its answers lose the upstream's connection-specific fields (h2Writer).
	cfg.NextProtos = []string{"h2", "http/1.1"}
	cp.mu.Lock()
	if len(cp.certs) >= maxLeafCache {
		clear(cp.certs)
	}
	cp.certs[key] = cfg
	cp.mu.Unlock()
	return cfg, nil
}

func hostOnly(hostport string) string {
	h := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		h = hh
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// replayConn reads r (the sniffed bytes, then the connection) and writes to Conn.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands out one connection, then blocks until it is done, so
// http.Server serves exactly that connection.
type oneConnListener struct {
	conn net.Conn
	done chan struct{}
	once sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }
