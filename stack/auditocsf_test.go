package stack

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

// TestAuditConfigOCSF: OpenAudit exports every record as OCSF events beside the chain
// by default (<dir>/ocsf), and audit.ocsf.disabled turns the export off.
func TestAuditConfigOCSF(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "audit")
		ac, err := AuditConfig{Dir: dir, OCSF: AuditOCSF{Disabled: disabled}}.resolved()
		if err != nil {
			t.Fatal(err)
		}
		w, err := OpenAudit(ac, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			w.Append(audit.Record{SandboxID: "sb1", Source: audit.SourceDNS, Action: "allow", DstHost: "pypi.org"})
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		events, err := os.ReadFile(filepath.Join(dir, "ocsf", "audit-00000000000000000001.ocsf.jsonl"))
		switch {
		case disabled && !errors.Is(err, os.ErrNotExist):
			t.Errorf("export disabled, but %v", err)
		case !disabled && err != nil:
			t.Error(err)
		case !disabled && bytes.Count(events, []byte(`"class_uid":4003`)) != 3:
			t.Errorf("want 3 DNS Activity events, got:\n%s", events)
		}
	}
}
