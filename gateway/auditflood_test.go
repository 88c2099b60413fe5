package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// An anonymous client flooding the gateway with requests for sandboxes that do not
// exist gets its refusal burst written and suppressed records counting the rest, in a
// real audit log behind real Caddy; another client address's refusals are all written.
func TestAuditFloodRefusalsLimitedPerClient(t *testing.T) {
	dir := t.TempDir()
	w, err := audit.New(audit.Config{Dir: dir, Logger: slog.New(slog.DiscardHandler),
		RateLimit: audit.RateLimit{Rate: 100, Burst: 1000, RefusalRate: 5, RefusalBurst: 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e := newEnv(t, func(c *Config) { c.Audit = w })
	from := func(ip string) *http.Client {
		addr := e.gw.Addr()
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			return d.DialContext(ctx, "tcp", addr)
		}, MaxIdleConnsPerHost: 4}}
	}
	flooder, other := from("127.0.0.1"), from("127.0.0.2")
	get := func(c *http.Client, host string) {
		req, _ := http.NewRequest("GET", e.base()+"/", nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d, want 404", resp.StatusCode)
		}
	}
	const flood, quiet = 600, 10
	start := time.Now()
	for i := range flood {
		get(flooder, e.hostOf("80-nobody"))
		if i%(flood/quiet) == 0 {
			get(other, e.hostOf("80-nobody-else"))
		}
	}
	elapsed := time.Since(start)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var written, suppressed, otherWritten int
	err = audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
		switch {
		case strings.HasPrefix(r.Src, "127.0.0.1") && r.Action == audit.ActionSuppressed:
			suppressed += int(r.Extra["suppressed"].(float64))
		case strings.HasPrefix(r.Src, "127.0.0.1") && r.Source == audit.SourceGateway:
			written++
		case strings.HasPrefix(r.Src, "127.0.0.2") && r.Action == "deny":
			otherWritten++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	limit := 20 + int(5*elapsed.Seconds()) + 1
	t.Logf("%d refusals in %s: %d written, %d suppressed", flood, elapsed, written, suppressed)
	if written > limit || written+suppressed != flood {
		t.Errorf("127.0.0.1: %d written + %d suppressed; want at most %d written and %d in all", written, suppressed, limit, flood)
	}
	if otherWritten != quiet {
		t.Errorf("127.0.0.2: %d of its %d refusals written", otherWritten, quiet)
	}
	if _, err := audit.Verify(dir); err != nil {
		t.Fatal(err)
	}
}
