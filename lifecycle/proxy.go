package lifecycle

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// strippedHeaders never reach a sandbox through the proxy: they are the platform's
// credentials, not the sandbox's.
var strippedHeaders = []string{"OPEN-SANDBOX-API-KEY", AccessTokenHeader, AirlockAccessTokenHeader}

type proxyTargetKey struct{}

type proxyTarget struct {
	host    string // ip:port
	rawPath string // escaped path below the proxy prefix, starting with /
}

// newProxy returns the one reverse proxy every proxied request goes through: a pooled
// transport, responses flushed as they arrive (SSE event by event), WebSocket and other
// upgrades passed through, hop-by-hop headers dropped (httputil does that) and the
// platform's credentials stripped.
func (s *Server) newProxy() (*httputil.ReverseProxy, *http.Transport) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(proxyTargetKey{}).(proxyTarget)
			path, err := url.PathUnescape(t.rawPath)
			if err != nil {
				path = t.rawPath
			}
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.host
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = t.rawPath
			pr.Out.Host = t.host
			pr.SetXForwarded()
			for _, h := range strippedHeaders {
				pr.Out.Header.Del(h)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			s.fail(w, r, fmt.Errorf("%w: %v", ErrUpstream, err))
		},
	}, tr
}

// handleProxy serves /sandboxes/{id}/proxy/{port}/… (OpenSandbox server proxy): any
// method, any port, to the sandbox's address on the Airlock network, once admitProxy
// has admitted the request (refusals are 401 and audited with source ingress).
func (s *Server) handleProxy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		s.fail(w, r, fmt.Errorf("%w: port must be a number from 1 to 65535", ErrInvalidRequest))
		return
	}
	s.mu.Lock()
	e, ok := s.sbx[id]
	var st opensandbox.State
	var addr netip.Addr
	sb := proxySandbox{found: ok}
	if ok {
		st, addr = e.rec.Status.State, e.rec.Address
		sb.token, sb.secure = e.rec.AccessToken, e.rec.secure()
	}
	s.mu.Unlock()
	if err := s.admitProxy(r, id, port, sb); err != nil {
		s.auditIngress(r, id, port, s.portMode(sb.secure, port), err)
		s.fail(w, r, err)
		return
	}
	if !ok {
		s.fail(w, r, fmt.Errorf("%w: %q", ErrNotFound, id))
		return
	}
	if st == opensandbox.Pending {
		// Not before its egress is enforced: a connection opened before the datapath
		// attached would have its replies dropped once it has (they belong to no flow
		// the filter saw start). execd holds such requests anyway.
		st, addr = s.awaitStarted(r.Context(), id)
	}
	switch st {
	case opensandbox.Running, opensandbox.Resuming:
	case opensandbox.Paused, opensandbox.Pausing:
		s.fail(w, r, fmt.Errorf("%w: sandbox %s is %s: resume it first (POST /sandboxes/%s/resume)", ErrInvalidState, id, st, id))
		return
	default:
		s.fail(w, r, fmt.Errorf("%w: sandbox %s is %s", ErrUnavailable, id, st))
		return
	}
	if !addr.IsValid() {
		s.fail(w, r, fmt.Errorf("%w: sandbox %s has no address yet", ErrUnavailable, id))
		return
	}
	prefix := "/sandboxes/" + id + "/proxy/" + r.PathValue("port")
	if port == opensandbox.EgressAPIPort {
		s.handleEgressAPI(w, r, id, "/"+r.PathValue("rest"))
		return
	}
	rest := r.URL.EscapedPath()
	if i := strings.Index(rest, prefix); i >= 0 {
		rest = rest[i+len(prefix):]
	}
	if rest == "" || rest[0] != '/' {
		rest = "/" + rest
	}
	t := proxyTarget{host: net.JoinHostPort(addr.String(), strconv.Itoa(port)), rawPath: rest}
	// Full duplex: an upstream may answer before the transport has finished reading the
	// request body (execd answers as soon as it has parsed it); without this the HTTP/1
	// server closes the body when the response starts and the upstream write fails.
	_ = http.NewResponseController(w).EnableFullDuplex()
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), proxyTargetKey{}, t)))
}

// proxyPendingWait bounds how long the server proxy holds a request for a Pending
// sandbox (execd holds requests as long before answering 503 STARTING).
const proxyPendingWait = 30 * time.Second

// awaitStarted waits until sandbox id leaves Pending (or proxyPendingWait, or ctx) and
// returns its state and address then.
func (s *Server) awaitStarted(ctx context.Context, id string) (opensandbox.State, netip.Addr) {
	deadline := time.Now().Add(proxyPendingWait)
	for {
		s.mu.Lock()
		e, ok := s.sbx[id]
		var st opensandbox.State = opensandbox.Terminated
		var addr netip.Addr
		if ok {
			st, addr = e.rec.Status.State, e.rec.Address
		}
		s.mu.Unlock()
		if st != opensandbox.Pending || time.Now().After(deadline) {
			return st, addr
		}
		select {
		case <-ctx.Done():
			return st, addr
		case <-time.After(pingInterval):
		}
	}
}
