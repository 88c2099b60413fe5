package egressd

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRelayHTTP runs relayHTTP between a client and an upstream on loopback, for a
// connection whose first request was allowed for allowed.test. The daemon knows no
// sandbox, so a request for any other name closes the connection.
func TestRelayHTTP(t *testing.T) {
	var mu sync.Mutex
	var seen []string // "host path upgrade" per request the upstream got
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %q %d", r.Host, r.URL.RequestURI(), r.Header.Get("Upgrade"), len(r.Header.Values("Host"))))
		mu.Unlock()
		switch r.URL.Path {
		case "/stream":
			fmt.Fprint(w, "first")
			w.(http.Flusher).Flush()
			time.Sleep(time.Second)
			fmt.Fprint(w, "second")
		case "/upload":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "got %d", len(b))
		case "/ws":
			c, brw, _ := w.(http.Hijacker).Hijack()
			defer c.Close()
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			line, _ := brw.ReadString('\n')
			io.WriteString(c, "echo "+line)
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	// conn returns the client end of a connection relayed by relayHTTP.
	conn := func(t *testing.T) (net.Conn, *bufio.Reader) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		server, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		upc, err := net.Dial("tcp", upAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		p := &l7Proxy{d: &Daemon{}}
		src := netip.MustParseAddrPort(server.RemoteAddr().String())
		go func() {
			defer server.Close()
			defer upc.Close()
			p.relayHTTP(server.(*net.TCPConn), upc.(*net.TCPConn), nil, src, upAddr, "allowed.test", nil)
		}()
		client.SetDeadline(time.Now().Add(10 * time.Second))
		return client, bufio.NewReader(client)
	}
	do := func(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (int, string) {
		t.Helper()
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, "closed"
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			return ""
		}
		return seen[len(seen)-1]
	}

	t.Run("keepalive_then_other_host", func(t *testing.T) {
		c, br := conn(t)
		for range 2 {
			if code, body := do(t, c, br, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); code != 200 || body != "ok" {
				t.Fatalf("allowed request: %d %q", code, body)
			}
		}
		n := count()
		if code, body := do(t, c, br, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); code != 403 && body != "closed" {
			t.Errorf("another name on the kept-alive connection: %d %q", code, body)
		}
		if count() != n {
			t.Errorf("the upstream got the refused request: %v", seen)
		}
	})
	t.Run("absolute_form_and_second_host", func(t *testing.T) {
		c, br := conn(t)
		if code, _ := do(t, c, br, "GET http://allowed.test/x?y=1 HTTP/1.1\r\nHost: other.test\r\n\r\n"); code != 200 {
			t.Fatalf("absolute form: %d", code)
		}
		if got := last(); got != `allowed.test /x?y=1 "" 0` {
			t.Errorf("upstream saw %s, want the checked name in one Host and an origin-form target", got)
		}
		// Two Host headers: not a request http.ReadRequest accepts; nothing is forwarded.
		n := count()
		if code, body := do(t, c, br, "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n"); body != "closed" {
			t.Errorf("two Host headers: %d %q, want the connection closed", code, body)
		}
		if count() != n {
			t.Errorf("the upstream got a request with two Host headers: %v", seen)
		}
	})
	t.Run("h2c_upgrade_dropped", func(t *testing.T) {
		c, br := conn(t)
		if code, _ := do(t, c, br, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"); code != 200 {
			t.Fatalf("h2c upgrade request: %d", code)
		}
		if got := last(); got != `allowed.test / "" 0` {
			t.Errorf("upstream saw %s, want no Upgrade", got)
		}
	})
	t.Run("connect_refused", func(t *testing.T) {
		c, br := conn(t)
		if code, body := do(t, c, br, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"); code != 403 && body != "closed" {
			t.Errorf("CONNECT: %d %q", code, body)
		}
	})
	t.Run("expect_continue_upload", func(t *testing.T) {
		c, br := conn(t)
		io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 100 {
			t.Fatalf("want 100 Continue before the body: %v %v", resp, err)
		}
		io.WriteString(c, "hello")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "got 5" {
			t.Errorf("upload: %q", b)
		}
	})
	t.Run("streamed_body_not_held_back", func(t *testing.T) {
		c, br := conn(t)
		io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
			t.Fatalf("first part: %q %v", buf, err)
		}
		if d := time.Since(start); d > 700*time.Millisecond {
			t.Errorf("the first part arrived after %v, with the rest", d)
		}
		if rest, _ := io.ReadAll(resp.Body); string(rest) != "second" {
			t.Errorf("rest: %q", rest)
		}
	})
	t.Run("http10_client", func(t *testing.T) {
		c, br := conn(t)
		code, body := do(t, c, br, "GET /stream HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
		if code != 200 || body != "firstsecond" {
			t.Errorf("HTTP/1.0 client of a chunked response: %d %q", code, body)
		}
	})
	t.Run("websocket_spliced_after_101", func(t *testing.T) {
		c, br := conn(t)
		io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("want 101: %v %v", resp, err)
		}
		io.WriteString(c, "GET / HTTP/1.1 not a request\n")
		line, _ := br.ReadString('\n')
		if !strings.HasPrefix(line, "echo GET / HTTP/1.1 not a request") {
			t.Errorf("after 101: %q", line)
		}
	})
}
