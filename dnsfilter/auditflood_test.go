package dnsfilter

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// A sandbox looping on denied DNS queries gets its burst of records and suppressed
// records counting the rest, in a real audit log; another sandbox's queries in the
// middle of the flood are all written, and so are an unknown address's up to its own
// budget.
func TestAuditFloodDeniedQueriesLimitedPerSandbox(t *testing.T) {
	dir := t.TempDir()
	w, err := audit.New(audit.Config{Dir: dir, Logger: slog.New(slog.DiscardHandler),
		RateLimit: audit.RateLimit{Rate: 10, Burst: 50}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	pol, err := policies.Load("test-policy", []byte(testPolicy), policies.CompileOptions{Overlay: policies.BaseOverlay(), Version: 5})
	if err != nil {
		t.Fatal(err)
	}
	h := startFilter(t, testPolicy, func(c *Config) {
		c.Audit = w
		c.Lookup = func(src netip.Addr) (Sandbox, bool) {
			switch src {
			case netip.MustParseAddr("127.0.0.1"):
				return Sandbox{ID: "sb-flood", Policy: pol}, true
			case netip.MustParseAddr("127.0.0.2"):
				return Sandbox{ID: "sb-quiet", Policy: pol}, true
			}
			return Sandbox{}, false
		}
	})
	ask := func(from string, name string) {
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second,
			Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		if _, _, err := c.Exchange(m, h.srv.Addr().String()); err != nil {
			t.Fatalf("query from %s: %v", from, err)
		}
	}
	const flood, quiet = 1500, 30
	start := time.Now()
	for i := range flood {
		ask("127.0.0.1", "x.example.org") // denied by the policy
		if i%(flood/quiet) == 0 {
			ask("127.0.0.2", "y.example.org")
		}
	}
	elapsed := time.Since(start)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var written, suppressed, suppressedRecs, quietWritten int
	err = audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
		switch {
		case r.SandboxID == "sb-flood" && r.Action == audit.ActionSuppressed:
			suppressedRecs++
			suppressed += int(r.Extra["suppressed"].(float64))
		case r.SandboxID == "sb-flood":
			written++
		case r.SandboxID == "sb-quiet" && r.Action == "deny":
			quietWritten++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	limit := 50 + int(10*elapsed.Seconds()) + 1
	t.Logf("%d queries in %s: %d written, %d suppressed in %d records", flood, elapsed, written, suppressed, suppressedRecs)
	if written > limit || written+suppressed != flood {
		t.Errorf("sb-flood: %d written + %d suppressed; want at most %d written and %d in all", written, suppressed, limit, flood)
	}
	if max := int(elapsed/audit.SuppressWindow) + 2; suppressedRecs == 0 || suppressedRecs > max {
		t.Errorf("sb-flood: %d suppressed records, want 1..%d (one per window)", suppressedRecs, max)
	}
	if quietWritten != quiet {
		t.Errorf("sb-quiet: %d of its %d denied queries written", quietWritten, quiet)
	}
	if _, err := audit.Verify(dir); err != nil {
		t.Fatal(err)
	}
}
