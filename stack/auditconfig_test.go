package stack

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// airlock.yaml's audit.rateLimit and audit.retention reach the writer (defaults for what
// is not set, negative values turn a limit off), and OpenAudit's writer limits a
// flooding sandbox by default.
func TestAuditConfigRateLimitAndRetention(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "airlock.yaml")
	body := "audit:\n  rateLimit:\n    rate: 5\n  retention:\n    maxBytes: -1\n    maxAge: 24h\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(p, false)
	if err != nil {
		t.Fatal(err)
	}
	rl, ret := c.Audit.writerLimits()
	if rl.Rate != 5 || rl.Burst != 1000 || rl.RefusalRate != 20 || ret.MaxBytes != 0 || ret.MaxAge != 24*time.Hour {
		t.Errorf("rate limit %+v, retention %+v", rl, ret)
	}

	ac, err := AuditConfig{Dir: filepath.Join(dir, "audit")}.resolved()
	if err != nil {
		t.Fatal(err)
	}
	if ac.RateLimit != audit.DefaultRateLimit() || ac.Retention.MaxBytes != audit.DefaultRetention().MaxBytes {
		t.Errorf("resolved defaults %+v", ac)
	}
	w, err := OpenAudit(ac, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3000 {
		w.Append(audit.Record{SandboxID: "sb-flood", Source: audit.SourceDNS, Action: "deny", DstHost: "x.example.org"})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	written, suppressed := 0, 0
	err = audit.Scan(ac.Dir, audit.Filter{}, func(r audit.Record) error {
		if r.Action == audit.ActionSuppressed {
			suppressed += int(r.Extra["suppressed"].(float64))
		} else {
			written++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if written > 1100 || written+suppressed != 3000 {
		t.Errorf("%d written + %d suppressed of 3000: want the default burst of 1000 (plus refill) written", written, suppressed)
	}
}
