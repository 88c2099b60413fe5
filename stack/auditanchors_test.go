package stack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

// airlock.yaml's audit.anchors.dir reaches OpenAudit's writer: its checkpoints and
// heads are anchored there and the log verifies against them; a URL that is not
// http(s) is refused.
func TestAuditConfigAnchors(t *testing.T) {
	dir := t.TempDir()
	sink := filepath.Join(dir, "other-mount")
	p := filepath.Join(dir, "airlock.yaml")
	body := "audit:\n  dir: " + filepath.Join(dir, "audit") + "\n  maxFileBytes: 2048\n  anchors:\n    dir: " + sink + "\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(p, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Audit.Anchors.Dir != sink {
		t.Fatalf("anchors %+v", c.Audit.Anchors)
	}
	w, err := OpenAudit(c.Audit, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		w.Append(audit.Record{SandboxID: "sb", Source: audit.SourceDNS, Action: "allow", DstHost: "x.example.org", DstPort: i})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	as, err := audit.ReadAnchors(sink)
	if err != nil || len(as) < 3 {
		t.Fatalf("%d anchors in %s: %v", len(as), sink, err)
	}
	_, pubPath := c.Audit.KeyFiles()
	pub, err := audit.LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if ar, err := audit.VerifyAnchors(c.Audit.Dir, as, audit.VerifyOptions{PublicKey: pub}); err != nil || ar.Finding != audit.FindingOK || ar.LastSeq != 100 {
		t.Fatalf("against its anchors: %+v %v", ar, err)
	}
	bad := c.Audit
	bad.Anchors.URL = "ftp://anchors.example"
	if _, err := bad.resolved(); err == nil {
		t.Error("an ftp:// anchors URL was accepted")
	}
}
