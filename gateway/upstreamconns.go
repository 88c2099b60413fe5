package gateway

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
)

// upstreamConns tracks the reverse proxy's connections by remote address, so that
// deleting a sandbox cuts its in-flight requests and streams and drops its pooled
// connections at once (a sandbox that later gets the same address never receives
// them), without a cancellable context per request. Sandbox addresses are unique on a
// host or cluster; upstreams that share one (loopback test servers) are cut together.
type upstreamConns struct {
	mu   sync.Mutex
	byIP map[netip.Addr]map[*trackedConn]struct{}
}

func newUpstreamConns() *upstreamConns {
	return &upstreamConns{byIP: map[netip.Addr]map[*trackedConn]struct{}{}}
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// wrap returns dial with every connection it makes tracked by the remote address.
func (u *upstreamConns) wrap(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		ap, perr := netip.ParseAddrPort(addr)
		if perr != nil {
			return c, nil // not an IP:port (a name): not a sandbox address
		}
		tc := &trackedConn{Conn: c, u: u, ip: ap.Addr().Unmap()}
		u.mu.Lock()
		set := u.byIP[tc.ip]
		if set == nil {
			set = map[*trackedConn]struct{}{}
			u.byIP[tc.ip] = set
		}
		set[tc] = struct{}{}
		u.mu.Unlock()
		return tc, nil
	}
}

// closeAddr closes every connection to ip and reports how many it closed.
func (u *upstreamConns) closeAddr(ip netip.Addr) int {
	if !ip.IsValid() {
		return 0
	}
	u.mu.Lock()
	set := u.byIP[ip.Unmap()]
	delete(u.byIP, ip.Unmap())
	u.mu.Unlock()
	for c := range set {
		c.Conn.Close()
	}
	return len(set)
}

// open reports how many tracked connections go to ip (for tests and metrics).
func (u *upstreamConns) open(ip netip.Addr) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.byIP[ip.Unmap()])
}

// trackedConn leaves the set when it is closed.
type trackedConn struct {
	net.Conn
	u    *upstreamConns
	ip   netip.Addr
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.u.mu.Lock()
		if set := c.u.byIP[c.ip]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(c.u.byIP, c.ip)
			}
		}
		c.u.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite half-closes when the connection can (reverse_proxy's upgraded streams
// propagate a half-close this way).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
