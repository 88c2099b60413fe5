package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

// TestAuditVerifyAnchors: `airlock audit verify DIR --anchors SINK` says ok for an
// intact log and "truncated" for one whose last records were cut off.
func TestAuditVerifyAnchors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	sink := filepath.Join(t.TempDir(), "anchors")
	key, _, err := audit.LoadOrCreateSigningKey(audit.DefaultKeyFiles(dir))
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, SigningKey: key, Anchors: []audit.AnchorSink{audit.DirSink{Dir: sink}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		w.Append(audit.Record{SandboxID: "a", Source: audit.SourceDNS, DstHost: "x.example.com", Action: "allow"})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, newAuditCmd(), "verify", dir, "--anchors", sink)
	if err != nil || !strings.Contains(out, "verdict:     ok") || !strings.Contains(out, "last names seq 50") {
		t.Fatalf("verify --anchors: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	data, _ := os.ReadFile(files[0])
	lines := bytes.SplitAfter(data, []byte("\n"))
	if err := os.WriteFile(files[0], bytes.Join(lines[:40], nil), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, newAuditCmd(), "verify", dir, "--anchors", sink)
	if err == nil || !strings.Contains(out, "truncated: ") || !strings.Contains(out, "the log ends at seq 40") {
		t.Fatalf("verify --anchors after cutting the tail: %v\n%s", err, out)
	}
}
