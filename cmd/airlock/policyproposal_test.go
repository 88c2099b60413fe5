package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/sdk"
)

// TestPolicyProposeDecideCLI: `airlock policy propose --sandbox ID --write NAME`
// approves the server's pending proposal into its library (NAME.yaml, served at once,
// the sandbox under it); a second --write of the same name is refused (409) until
// --replace; --reject clears a proposal; the flags of a local proposal do not combine
// with a decision.
func TestPolicyProposeDecideCLI(t *testing.T) {
	libDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(libDir, "base.yaml"), []byte("defaultAction: deny\negress:\n  - action: allow\n    target: pypi.org\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := library.Open(library.Config{Dir: libDir})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, SyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	h := lctest.New(t, lctest.Options{APIKey: cliKey, Library: lib, Audit: aw, AuditDir: dir})
	var created []sdk.Sandbox
	if err := json.Unmarshal([]byte(runSandbox(t, h, "create", "--json", "--no-wait", "--image", h.Image, "--policy", "base")), &created); err != nil {
		t.Fatal(err)
	}
	id := created[0].ID
	deny := func(name string) { // a refusal at DNS, readable before returning
		aw.Append(audit.Record{Time: time.Now(), SandboxID: id, Source: audit.SourceDNS, DstHost: name, Action: "deny"})
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			recs, _, err := audit.Query(dir, audit.Filter{SandboxID: id})
			if err == nil && len(recs) > 0 && recs[len(recs)-1].DstHost == name {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the record of %s did not reach the log (%v)", name, err)
			}
		}
	}

	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--approve", "--since", "1h"); err == nil || !strings.Contains(err.Error(), "--since") {
		t.Errorf("--approve with --since: %v", err)
	}
	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--approve"); err == nil || !strings.Contains(err.Error(), "nothing pending") {
		t.Errorf("--approve with nothing pending: %v", err)
	}
	deny("first.test")
	out, err := runPolicy(t, h, "propose", "--sandbox", id, "--write", "learned")
	if err != nil || !strings.Contains(out, "target: first.test") {
		t.Fatalf("propose --write: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(libDir, "learned.yaml"))
	if err != nil || string(b) != out {
		t.Fatalf("learned.yaml (%v) is not what the command printed:\n%s", err, b)
	}
	if p, ok := lib.Get("learned"); !ok || p.Version != 1 {
		t.Fatalf("the library does not serve learned: %+v", p)
	}
	if out := runSandbox(t, h, "policy", id); !strings.Contains(out, "named policy learned") {
		t.Errorf("the sandbox is not under learned: %s", out)
	}

	deny("second.test")
	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--write", "learned"); err == nil || !strings.Contains(err.Error(), "POLICY_EXISTS") && !strings.Contains(err.Error(), "already has") {
		t.Errorf("--write of a taken name: %v", err)
	}
	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--write", "learned", "--replace"); err != nil {
		t.Fatalf("--write --replace: %v", err)
	}
	if p, _ := lib.Get("learned"); p.Version != 2 || !strings.Contains(string(p.Source), "second.test") {
		t.Errorf("after --replace: %+v\n%s", p, p.Source)
	}

	deny("third.test")
	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--reject"); err != nil {
		t.Fatalf("--reject: %v", err)
	}
	if _, err := runPolicy(t, h, "propose", "--sandbox", id, "--approve"); err == nil || !strings.Contains(err.Error(), "nothing pending") {
		t.Errorf("after --reject the proposal is still pending: %v", err)
	}
}
