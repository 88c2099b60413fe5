package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The audit row reports the log's size and retention, is ok when the file system has
// room for what retention allows, and degraded (not hard) when it has not.
func TestAuditDiskRow(t *testing.T) {
	cfg, _ := healthy(t)
	cfg.AuditDir = filepath.Join(t.TempDir(), "audit")
	must(t, os.MkdirAll(cfg.AuditDir, 0o700))
	must(t, os.WriteFile(filepath.Join(cfg.AuditDir, "audit-00000000000000000001.jsonl"), make([]byte, 3000), 0o600))
	cfg.AuditMaxBytes = 1 << 20
	rep := Run(context.Background(), cfg)
	r, ok := rep.Row("audit log disk")
	if !ok || r.Status != OK || !strings.Contains(r.Detail, "2.9 KiB in 1 files") || !strings.Contains(r.Detail, "limit 1.0 MiB") {
		t.Fatalf("row %+v (present %v), want ok with 2.9 KiB in 1 files and the limit", r, ok)
	}
	cfg.AuditMaxBytes = 1 << 62 // more than any disk holds
	rep = Run(context.Background(), cfg)
	if r, _ = rep.Row("audit log disk"); r.Status != Degraded || r.Hard || !strings.Contains(r.Fix, "audit.retention.maxBytes") || !rep.OK {
		t.Fatalf("row %+v, report ok %v: want degraded, not hard, with the retention fix", r, rep.OK)
	}
	cfg.AuditDir = ""
	if _, ok := Run(context.Background(), cfg).Row("audit log disk"); ok {
		t.Error("audit row present without an audit directory")
	}
}
