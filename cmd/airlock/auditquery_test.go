package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// TestAuditQuery: airlock audit query over a chain written by the real writer selects
// by principal, sandbox, command, kind and time (each alone and together), prints a
// table or JSON Lines, says when --limit cut the answer, and refuses bad flags with a
// message naming the flag.
func TestAuditQuery(t *testing.T) {
	dir := t.TempDir()
	w, err := audit.New(audit.Config{Dir: dir, MaxFileBytes: 1500, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	x := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	recs := []audit.Record{
		{Time: at(0), SandboxID: "sbA", Source: audit.SourceControl, Action: "allow", Reason: "sandbox.create success",
			Extra: x("op", "sandbox.create", "principal", "pk_alice", "status", 202, "request_id", "r1")},
		{Time: at(1), SandboxID: "sbA", Source: audit.SourceExecd, Action: "allow",
			Extra: x("op", "command", "command", "pip install requests", "exit_code", 0, "principal", "pk_alice", "outcome", "success")},
		{Time: at(2), SandboxID: "sbA", Source: audit.SourceDNS, QType: "A", DstHost: "pypi.org", Action: "allow"},
		{Time: at(2), SandboxID: "sbA", Source: audit.SourceBPF, Proto: "tcp", DstIP: "151.101.0.223", DstPort: 443, Action: "allow",
			Extra: x("process", map[string]any{"pid": 42, "exe": "/usr/bin/python3", "cmdline": "python3 -m pip install requests"})},
		{Time: at(3), SandboxID: "sbB", Source: audit.SourceControl, Action: "allow",
			Extra: x("op", "sandbox.create", "principal", "pk_bob", "status", 202)},
		{Time: at(4), SandboxID: "sbB", Source: audit.SourceExecd, Action: "allow",
			Extra: x("op", "command", "command", "curl https://example.com", "exit_code", 7, "principal", "pk_bob", "outcome", "failure")},
		{Time: at(5), SandboxID: "sbA", Source: audit.SourceControl, Action: "deny", Reason: `sandbox "sbA" not found`,
			Extra: x("op", "sandbox.delete", "principal", "pk_bob", "status", 404, "refusal", "not_owner")},
		{Time: at(6), SandboxID: "sbB", Source: audit.SourceGateway, Proto: "http", DstHost: "sbB-8080.example", Action: "allow",
			Reason: "public", Extra: x("method", "GET", "path", "/", "status", 200)},
		{Time: at(7), Source: audit.SourceControl, Action: "allow",
			Extra: x("op", "key.create", "principal", "admin", "target_type", "key", "target", "pk_bob", "status", 201)},
	}
	for _, r := range recs {
		if !w.TryAppend(r) {
			t.Fatal("queue full")
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	seqs := func(args ...string) string {
		t.Helper()
		out, err := run(t, newAuditCmd(), append([]string{"query", "--dir", dir, "-o", "json"}, args...)...)
		if err != nil {
			t.Fatalf("query %v: %v\n%s", args, err, out)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var r audit.Record
			if err := json.Unmarshal([]byte(line), &r); err != nil || r.Hash == "" {
				t.Fatalf("query %v: line %q: %v", args, line, err)
			}
			got = append(got, string(rune('0'+r.Seq)))
		}
		return strings.Join(got, "")
	}
	for _, tc := range []struct {
		args []string
		want string // seqs, one digit each
	}{
		{nil, "123456789"},
		{[]string{"--principal", "pk_bob"}, "567"},
		{[]string{"--principal", "pk_bob", "--kind", "control"}, "57"},
		{[]string{"--sandbox", "sbA"}, "12347"},
		{[]string{"--command", "pip install"}, "24"},
		{[]string{"--command", "pip install", "--kind", "flow"}, "4"},
		{[]string{"--kind", "http,dns"}, "38"},
		{[]string{"--kind", "control", "--kind", "execd"}, "125679"},
		{[]string{"--since", at(3).Format(time.RFC3339), "--until", at(6).Format(time.RFC3339)}, "567"},
		{[]string{"--since", "1h"}, ""}, // the records are from 2026-11-20
		{[]string{"--principal", "nobody"}, ""},
	} {
		if got := seqs(tc.args...); got != tc.want {
			t.Errorf("query %v: seqs %q, want %q", tc.args, got, tc.want)
		}
	}

	out, err := run(t, newAuditCmd(), "query", "--dir", dir, "--sandbox", "sbA")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TIME", "PRINCIPAL", "sandbox.create", "pk_alice", `command "pip install requests" exit 0 (success)`,
		`tcp → 151.101.0.223:443 by "python3 -m pip install requests"`, `sandbox.delete → 404: sandbox "sbA" not found`} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if out, err := run(t, newAuditCmd(), "query", "--dir", dir, "--limit", "2"); err != nil || strings.Count(out, "\n") != 4 ||
		!strings.Contains(out, "more than 2 records match") {
		t.Errorf("--limit 2: %v\n%s", err, out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--since", "yesterday"}, `--since "yesterday": want an RFC 3339 time`},
		{[]string{"--until", "-5m"}, `--until "-5m"`},
		{[]string{"--since", "1h", "--until", "2h"}, "--since must be before --until"},
		{[]string{"--kind", "flows"}, `--kind: unknown kind "flows" (known: bpf, control,`},
		{[]string{"--output", "yaml"}, `--output "yaml": want table or json`},
		{[]string{"--limit", "0"}, "--limit must be at least 1"},
		{[]string{"extra"}, "unknown command"},
	} {
		out, err := run(t, newAuditCmd(), append([]string{"query", "--dir", dir}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error()+out, tc.want) {
			t.Errorf("query %v: %v %s, want an error with %q", tc.args, err, out, tc.want)
		}
	}
	if out, err := run(t, newAuditCmd(), "query", "--dir", t.TempDir()+"/missing"); err == nil || !strings.Contains(err.Error(), "reading") {
		t.Errorf("missing dir: %v %s", err, out)
	}
	help, _ := run(t, newAuditCmd(), "query", "--help")
	for _, want := range []string{"--principal", "--command", "--kind", "control, execd, dns, flow, http", "RFC 3339"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}
