package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// maxCacheTTL bounds how long any answer is cached, whatever upstream says.
const maxCacheTTL = time.Hour

type cacheKey struct {
	name  string
	qtype uint16
}

// resolved is an answer from resolve.
type resolved struct {
	// msg is the caller's own copy, TTLs aged by the time spent in the cache.
	msg *dns.Msg
	// entry is the cache entry msg was copied from (nil for a fresh exchange), and age
	// how long it had been cached, in whole seconds.
	entry *cacheEntry
	age   uint32
}

// resolve answers k from the cache or the upstreams. Concurrent misses for the same key
// share one upstream exchange.
func (s *Server) resolve(ctx context.Context, k cacheKey) (resolved, error) {
	if r, ok := s.cache.get(k, time.Now()); ok {
		s.metrics.cacheHit.Inc()
		return r, nil
	}
	s.metrics.cacheMiss.Inc()
	// The exchange is bounded by UpstreamTimeout per attempt, so waiting for it in
	// place (no extra goroutine per miss) cannot outlive the query by much.
	v, err, shared := s.flight.Do(k.name+"/"+strconv.Itoa(int(k.qtype)), func() (any, error) {
		m, err := s.exchange(k.name, k.qtype)
		if err == nil {
			s.cache.put(k, m, time.Now())
		}
		return m, err
	})
	if err != nil {
		return resolved{}, err
	}
	if shared {
		s.metrics.shared.Inc()
	}
	if ctx.Err() != nil {
		return resolved{}, ctx.Err()
	}
	return resolved{msg: v.(*dns.Msg).Copy()}, nil
}

// exchange asks the upstreams in order until one answers with something other than
// SERVFAIL or REFUSED.
func (s *Server) exchange(name string, qtype uint16) (*dns.Msg, error) {
	var errs []error
	var last *dns.Msg
	for _, u := range s.cfg.Upstreams {
		q := new(dns.Msg) // a fresh random id per attempt
		q.SetQuestion(dns.Fqdn(name), qtype)
		q.SetEdns0(advertisedUDPSize, false)
		t0 := time.Now()
		r, err := s.exchangeOne(q, u)
		s.metrics.upstream.WithLabelValues(u).Observe(time.Since(t0).Seconds())
		if err != nil {
			s.metrics.upstreamErrors.WithLabelValues(u).Inc()
			errs = append(errs, fmt.Errorf("%s: %w", u, err))
			continue
		}
		if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
			s.metrics.upstreamErrors.WithLabelValues(u).Inc()
			errs = append(errs, fmt.Errorf("%s: answered %s", u, dns.RcodeToString[r.Rcode]))
			last = r
			continue
		}
		return r, nil
	}
	if last != nil {
		return nil, fmt.Errorf("every upstream failed: %w", errors.Join(errs...))
	}
	return nil, errors.Join(errs...)
}

// exchangeOne asks one upstream over UDP and again over TCP when the answer is
// truncated. The answer must be for the question asked.
func (s *Server) exchangeOne(q *dns.Msg, upstream string) (*dns.Msg, error) {
	r, err := s.pools[upstream].exchange(q, s.cfg.UpstreamTimeout)
	if err == nil && r.Truncated {
		s.metrics.tcpRetries.Inc()
		c := &dns.Client{Net: "tcp", Timeout: s.cfg.UpstreamTimeout}
		r, _, err = c.Exchange(q, upstream)
	}
	if err != nil {
		return nil, err
	}
	if len(r.Question) != 1 || r.Question[0].Qtype != q.Question[0].Qtype ||
		!strings.EqualFold(r.Question[0].Name, q.Question[0].Name) {
		return nil, errors.New("answer does not match the question")
	}
	return r, nil
}

// udpPool keeps connected UDP sockets to one upstream, so a cold query costs no socket
// setup. Each socket serves at most maxUses queries (then a fresh one with a new random
// source port is opened) and answers are matched by the random message id and the
// question, which keeps off-path spoofing as hard as with a socket per query in
// practice; a socket that sees an error is dropped.
type udpPool struct {
	addr  string
	conns chan *pooledConn
}

type pooledConn struct {
	*dns.Conn
	uses int
}

const (
	poolSize = 64
	maxUses  = 100
)

func newUDPPool(addr string) *udpPool {
	return &udpPool{addr: addr, conns: make(chan *pooledConn, poolSize)}
}

func (p *udpPool) exchange(q *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	var c *pooledConn
	select {
	case c = <-p.conns:
	default:
		conn, err := (&dns.Client{Net: "udp", Timeout: timeout}).Dial(p.addr)
		if err != nil {
			return nil, err
		}
		conn.UDPSize = advertisedUDPSize
		c = &pooledConn{Conn: conn}
	}
	c.uses++
	c.SetDeadline(time.Now().Add(timeout))
	if err := c.WriteMsg(q); err != nil {
		c.Close()
		return nil, err
	}
	for {
		r, err := c.ReadMsg()
		if err != nil {
			c.Close()
			return nil, err
		}
		if r.Id != q.Id {
			continue // a late answer to an earlier query on this socket
		}
		p.put(c)
		return r, nil
	}
}

func (p *udpPool) put(c *pooledConn) {
	if c.uses >= maxUses {
		c.Close()
		return
	}
	select {
	case p.conns <- c:
	default:
		c.Close()
	}
}

func (p *udpPool) close() {
	for {
		select {
		case c := <-p.conns:
			c.Close()
		default:
			return
		}
	}
}

// cache holds upstream answers until their TTL runs out.
type cache struct {
	mu  sync.Mutex
	max int
	m   map[cacheKey]*cacheEntry
}

type cacheEntry struct {
	msg     *dns.Msg
	stored  time.Time
	expires time.Time
	// answers are the answers prepared from msg (prepared.go), guarded by cache.mu.
	answers map[answerKey]*prepared
}

func newCache(size int) *cache {
	return &cache{max: size, m: map[cacheKey]*cacheEntry{}}
}

func (c *cache) len() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return float64(len(c.m))
}

// get returns a copy of the cached answer with TTLs reduced by its age.
func (c *cache) get(k cacheKey, now time.Time) (resolved, bool) {
	if c.max < 0 {
		return resolved{}, false
	}
	c.mu.Lock()
	e, ok := c.m[k]
	if ok && !now.Before(e.expires) {
		delete(c.m, k)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return resolved{}, false
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns} {
		for _, rr := range sec {
			h := rr.Header()
			h.Ttl -= min(h.Ttl, age)
		}
	}
	return resolved{msg: m, entry: e, age: age}, true
}

// has reports whether an unexpired answer for k is cached.
func (c *cache) has(k cacheKey, now time.Time) bool {
	if c.max < 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	return ok && now.Before(e.expires)
}

// put caches m for its TTL: the lowest answer TTL, or for a negative answer the SOA's
// negative TTL (RFC 2308 §5); other answers are not cached.
func (c *cache) put(k cacheKey, m *dns.Msg, now time.Time) {
	if c.max < 0 {
		return
	}
	ttl, ok := cacheTTL(m)
	if !ok || ttl == 0 {
		return
	}
	e := &cacheEntry{msg: m, stored: now, expires: now.Add(min(ttl, maxCacheTTL))}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		evicted := 0
		for key, old := range c.m { // expired first, else arbitrary entries
			if !now.Before(old.expires) || evicted < c.max/100+1 {
				delete(c.m, key)
				evicted++
			}
		}
	}
	c.m[k] = e
}

func cacheTTL(m *dns.Msg) (time.Duration, bool) {
	switch {
	case m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0:
		ttl := m.Answer[0].Header().Ttl
		for _, rr := range m.Answer[1:] {
			ttl = min(ttl, rr.Header().Ttl)
		}
		return time.Duration(ttl) * time.Second, true
	case m.Rcode == dns.RcodeSuccess || m.Rcode == dns.RcodeNameError:
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				return time.Duration(min(soa.Hdr.Ttl, soa.Minttl)) * time.Second, true
			}
		}
	}
	return 0, false
}
