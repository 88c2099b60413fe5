package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

func TestAuditVerifyAndTail(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(t.TempDir(), "audit")
	if _, err := run(t, newAuditCmd(), "keygen", keys); err != nil {
		t.Fatal(err)
	}
	key, err := audit.LoadSigningKey(keys + ".key")
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, MaxFileBytes: 2048, SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		w.Append(audit.Record{SandboxID: []string{"a", "b"}[i%2], Source: audit.SourceDNS, DstHost: "x.example.com", Action: "allow"})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, newAuditCmd(), "verify", dir, "--public-key", keys+".pub")
	if err != nil || !strings.Contains(out, "records:     30 (seq 1..30)") || !strings.Contains(out, "chain:       ok") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	out, err = run(t, newAuditCmd(), "tail", "--dir", dir, "--sandbox", "b", "-n", "3")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last audit.Record
	if len(lines) != 3 || json.Unmarshal([]byte(lines[2]), &last) != nil || last.SandboxID != "b" || last.Seq != 30 {
		t.Fatalf("tail:\n%s", out)
	}

	files, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	data, _ := os.ReadFile(files[0])
	data[len(data)/2] ^= 0x20
	os.WriteFile(files[0], data, 0o600)
	out, err = run(t, newAuditCmd(), "verify", dir)
	if err == nil || !strings.Contains(out, "BROKEN:      "+filepath.Base(files[0])+" line ") {
		t.Fatalf("verify after tampering: %v\n%s", err, out)
	}
}
