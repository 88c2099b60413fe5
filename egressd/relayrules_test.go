package egressd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// TestRelayHTTPRules drives the plain-HTTP relay for a host with HTTP rules: on one
// kept-alive connection GET passes and a lower-case "get" reaches the upstream
// as GET; "delete" under /v1/ gets 403 JSON naming the rule, never reaches the
// upstream, and closes the connection.
func TestRelayHTTPRules(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	upc, err := net.Dial("tcp", upAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	rules := rulesFor(t, readOnlyDoc, "example.com")
	p := &l7Proxy{d: &Daemon{}}
	src := netip.MustParseAddrPort(server.RemoteAddr().String())
	go func() {
		defer server.Close()
		defer upc.Close()
		p.relayHTTP(server.(*net.TCPConn), upc.(*net.TCPConn), nil, src, upAddr, "example.com", rules)
	}()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	do := func(method, path string) (int, string) {
		t.Helper()
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: example.com\r\n\r\n", method, path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, "closed"
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ method, want string }{{"GET", "GET /v1/a"}, {"get", "GET /v1/a"}} {
		if code, body := do(c.method, "/v1/a"); code != 200 || body != c.want {
			t.Fatalf("%s: %d %q, want 200 %q", c.method, code, body, c.want)
		}
	}
	before := hits.Load()
	code, body := do("delete", "/v1/a")
	var denied httpDenied
	json.Unmarshal([]byte(body), &denied)
	if code != http.StatusForbidden || denied.Rule != "egress[0].http.rules[0]" {
		t.Fatalf("delete: %d %q, want 403 naming egress[0].http.rules[0]", code, body)
	}
	if hits.Load() != before {
		t.Fatal("the refused request reached the upstream")
	}
	if code, body := do("GET", "/v1/a"); code != 0 {
		t.Fatalf("after a refusal the connection is still served: %d %q", code, body)
	}
}
