package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
)

// Connections dialled through upstreamConns are closed by their remote address, leave
// the set when closed by their user, and keep TCP half-close.
func TestUpstreamConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	u := newUpstreamConns()
	dial := u.wrap((&net.Dialer{}).DialContext)
	ip := netip.MustParseAddr("127.0.0.1")
	var conns []net.Conn
	for range 3 {
		c, err := dial(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if n := u.open(ip); n != 3 {
		t.Fatalf("%d tracked connections, want 3", n)
	}
	if err := conns[0].(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("half-close: %v", err)
	}
	conns[0].Close()
	if n := u.open(ip); n != 2 {
		t.Fatalf("%d tracked after one closed, want 2", n)
	}
	if n := u.closeAddr(netip.MustParseAddr("127.0.0.2")); n != 0 {
		t.Fatalf("closed %d connections of another address", n)
	}
	if n := u.closeAddr(ip); n != 2 {
		t.Fatalf("closed %d, want 2", n)
	}
	for _, c := range conns[1:] {
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("write on a cut connection: %v", err)
		}
		c.Close() // the user's own close after the cut is harmless
	}
	if n := u.open(ip); n != 0 {
		t.Fatalf("%d tracked after the cut", n)
	}
}
