package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestWebSocketOverHTTP2 opens a WebSocket with RFC 8441 extended CONNECT over h2c through
// the gateway; reverse_proxy turns it into an RFC 6455 upgrade towards the sandbox. Go
// enables extended CONNECT only with GODEBUG=http2xconnect=1 read at process start, so
// the test re-runs itself in a child process with it (operators set the same variable;
// see README.md).
func TestWebSocketOverHTTP2(t *testing.T) {
	if !strings.Contains(os.Getenv("GODEBUG"), "http2xconnect=1") {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWebSocketOverHTTP2$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "GODEBUG=http2xconnect=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestWebSocketOverHTTP2")) {
			t.Fatalf("child run with GODEBUG=http2xconnect=1: %v\n%s", err, out)
		}
		return
	}
	e := newEnv(t, nil)
	up := loopback(t)
	e.put(runningSandbox("h2ws", up.addr))

	// x/net's HTTP/2 transport speaks extended CONNECT (the :protocol pseudo-header).
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	client := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, http.MethodConnect, e.base()+"/ws", pr)
	req.Host = e.hostOf(itoa(up.port) + "-h2ws")
	req.Header.Set(":protocol", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("extended CONNECT: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("extended CONNECT answered %s over %s, want 200 over HTTP/2", resp.Status, resp.Proto)
	}
	for _, msg := range []string{"over h2", strings.Repeat("y", 300)} {
		if _, err := pw.Write(maskedTextFrame(msg)); err != nil {
			t.Fatal(err)
		}
		got, err := readTextFrame(resp.Body)
		if err != nil {
			t.Fatalf("reading echo: %v", err)
		}
		if got != msg {
			t.Fatalf("echo %q, want %q", got, msg)
		}
	}
	// End the stream and wait for the gateway to finish it: stopping Caddy with an h2
	// WebSocket still open races inside reverse_proxy's graceful close (Caddy v2.11.9,
	// streaming.go writeCloseControl vs the copy goroutine).
	pw.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && ctx.Err() != nil {
		t.Fatalf("stream did not end after the client closed it: %v", err)
	}
}

// maskedTextFrame encodes one client text frame (RFC 6455 §5.2), masked as clients must.
func maskedTextFrame(msg string) []byte {
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	var b []byte
	b = append(b, 0x81)
	switch n := len(msg); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	default:
		b = append(b, 0x80|126, byte(n>>8), byte(n))
	}
	b = append(b, mask[:]...)
	for i := 0; i < len(msg); i++ {
		b = append(b, msg[i]^mask[i%4])
	}
	return b
}

// readTextFrame reads one unmasked server text frame (payload < 64 KiB).
func readTextFrame(r io.Reader) (string, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", err
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return "", err
		}
		n = int(ext[0])<<8 | int(ext[1])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return "", err
	}
	return string(p), nil
}
