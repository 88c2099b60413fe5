package kubedeploy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestWaitServing: an address where a server answers (any status) is serving; one
// that refuses connections is waited for until the context ends, and the error names it.
func TestWaitServing(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	up := strings.TrimPrefix(srv.URL, "http://")
	if err := WaitServing(context.Background(), up); err != nil {
		t.Fatalf("WaitServing(%s) with a server answering 404: %v", up, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = WaitServing(ctx, up, down)
	if err == nil || !strings.Contains(err.Error(), down) {
		t.Fatalf("WaitServing with %s refusing: %v, want an error naming it", down, err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("gave up after %s, before the context ended", waited)
	}
	// a server that starts while it waits is found
	l, err = net.Listen("tcp", down)
	if err != nil {
		t.Fatalf("listening on %s again: %v", down, err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = http.Serve(l, http.NotFoundHandler())
	}()
	defer l.Close()
	if err := WaitServing(context.Background(), down); err != nil {
		t.Fatalf("WaitServing(%s) with a server starting late: %v", down, err)
	}
}
