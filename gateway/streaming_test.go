package gateway

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// dialWebSocket opens a WebSocket to the gateway with the given Host and path.
func (e *env) dialWebSocket(t *testing.T, host, path string) *websocket.Conn {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+host+path, "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", e.gw.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		t.Fatalf("websocket handshake through the gateway (%s%s): %v", host, path, err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// TestWebSocket echoes messages through the gateway (RFC 6455 upgrade over HTTP/1.1), by
// host label and by path.
func TestWebSocket(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		e.put(runningSandbox("ws-box", up.addr))
		p := itoa(up.port)
		_, gwPort, _ := net.SplitHostPort(e.gw.Addr())
		for _, c := range []struct{ name, host, path string }{
			{"host", p + "-ws-box.airlock.localhost:" + gwPort, "/ws"},
			{"path", "127.0.0.1:" + gwPort, "/sandboxes/ws-box/proxy/" + p + "/ws"},
		} {
			t.Run(c.name, func(t *testing.T) {
				ws := e.dialWebSocket(t, c.host, c.path)
				for i, msg := range []string{"hello", strings.Repeat("x", 70_000), "bye"} {
					if err := websocket.Message.Send(ws, msg); err != nil {
						t.Fatalf("send %d: %v", i, err)
					}
					var got string
					if err := websocket.Message.Receive(ws, &got); err != nil {
						t.Fatalf("receive %d: %v", i, err)
					}
					if got != msg {
						t.Fatalf("echo %d: got %d bytes, want %d", i, len(got), len(msg))
					}
				}
			})
		}
	})
}

// TestSSE reads a server-sent event stream through the gateway event by event: the
// application sends event i+1 only after the client acknowledged event i (through the
// gateway too), so a gateway that buffered the stream would never deliver event 1 and the
// test would fail at its deadline.
func TestSSE(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		e.put(runningSandbox("sse-box", up.addr))
		host := e.hostOf(itoa(up.port) + "-sse-box")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", e.base()+"/sse?n=5&key=t1", nil)
		req.Host = host
		req.Header.Set("Accept", "text/event-stream")
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		br := bufio.NewReader(resp.Body)
		for i := 1; i <= 5; i++ {
			var data string
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if strings.HasPrefix(line, "data: ") {
					data = strings.TrimSpace(strings.TrimPrefix(line, "data: "))
				}
				if line == "\n" {
					break
				}
			}
			if want := `{"type":"event","seq":` + itoa(i) + `}`; data != want {
				t.Fatalf("event %d data %q, want %q", i, data, want)
			}
			ack := e.do("GET", host, "/ack?key=t1", nil)
			ack.Body.Close()
		}
		if _, err := br.ReadString('\n'); err == nil {
			t.Fatal("stream continued after the last event")
		}
	})
}
