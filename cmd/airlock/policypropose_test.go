package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// TestPolicyProposeThenTest records a session in a real audit log (a name reached, a
// name denied at DNS, requests to a host with HTTP rules, one refused, and the cloud
// metadata address), proposes a policy from it with --audit-dir, and replays the
// proposal with `policy test`: nothing allowed becomes denied, the refused name and
// request become allowed, the metadata address stays out of the proposal.
func TestPolicyProposeThenTest(t *testing.T) {
	dir := t.TempDir()
	w, err := audit.New(audit.Config{Dir: dir, SyncInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := func(method, path, action string) audit.Record {
		return audit.Record{SandboxID: "sb1", Source: audit.SourceL7, Proto: "http", DstHost: "rules.test", DstIP: "203.0.113.30",
			DstPort: 80, Action: action, Extra: map[string]any{"method": method, "path": path, "http_rule": true}}
	}
	for _, r := range []audit.Record{
		{SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "allowed.test", Action: "allow", Extra: map[string]any{"answers": []string{"203.0.113.10"}}},
		{SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "203.0.113.10", DstPort: 80, Action: "allow"},
		{SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "rules.test", Action: "allow", Extra: map[string]any{"answers": []string{"203.0.113.30"}}},
		req("GET", "/repos/o/r", "allow"),
		req("POST", "/api/items", "deny"),
		{SandboxID: "sb1", Source: audit.SourceDNS, DstHost: "denied.test", Action: "deny"},
		{SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "169.254.169.254", DstPort: 80, Action: "deny"},
		{SandboxID: "other", Source: audit.SourceDNS, DstHost: "other.test", Action: "allow"},
	} {
		w.Append(r)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "proposal.yaml")
	out, err := run(t, newPolicyCmd(), "propose", "--sandbox", "sb1", "--audit-dir", dir, "-o", file)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	y, _ := os.ReadFile(file)
	for _, want := range []string{"target: allowed.test", "target: rules.test", "methods: [POST]", "path: /api/items",
		"target: denied.test", "169.254.169.254 (1×): platform floor"} {
		if !strings.Contains(string(y), want) {
			t.Errorf("proposal lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(string(y), "other.test") {
		t.Errorf("proposal holds another sandbox's name:\n%s", y)
	}
	if !strings.Contains(out, "egress[1]  rules.test") {
		t.Errorf("no per-rule counts:\n%s", out)
	}
	out, err = run(t, newPolicyCmd(), "test", file, "--sandbox", "sb1", "--audit-dir", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"would deny (allowed before): 0", "would allow (denied before): 2",
		"http  POST http://rules.test:80/api/items", "dns   denied.test"} {
		if !strings.Contains(out, want) {
			t.Errorf("policy test output lacks %q:\n%s", want, out)
		}
	}
}
