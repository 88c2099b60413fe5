package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

// TestAuditVerifyTruncatedTail: `airlock audit verify` (the default key beside the
// directory) names the signed head of an intact log, and reports a log whose last
// records were cut off, which still chains by itself, as broken: "truncated".
func TestAuditVerifyTruncatedTail(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	key, _, err := audit.LoadOrCreateSigningKey(audit.DefaultKeyFiles(dir))
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		w.Append(audit.Record{SandboxID: "a", Source: audit.SourceDNS, DstHost: "x.example.com", Action: "allow"})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, newAuditCmd(), "verify", dir)
	if err != nil || !strings.Contains(out, "head:        seq 50, signed") || !strings.Contains(out, "chain:       ok") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	data, _ := os.ReadFile(files[0])
	lines := bytes.SplitAfter(data, []byte("\n"))
	if err := os.WriteFile(files[0], bytes.Join(lines[:40], nil), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, newAuditCmd(), "verify", dir)
	if err == nil || !strings.Contains(out, "BROKEN:") || !strings.Contains(out, "truncated: the log ends at seq 40 but the signed head says 50") {
		t.Fatalf("verify after cutting the tail: %v\n%s", err, out)
	}
}
