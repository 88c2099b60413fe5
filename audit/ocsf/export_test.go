package ocsf

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// records are one record of every kind Airlock writes, filled as the components fill
// them (dnsfilter, egressd's flows, refusals, L7 and credential decisions, the
// gateway, lifecycle's ingress refusals and policy changes, the policy library, the
// vault, agent actions through execd, the writer's loss and suppressed records, and a
// source unknown here).
func records() []audit.Record {
	now := time.Date(2026, 3, 4, 4, 6, 7, 123456000, time.UTC)
	x := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	return []audit.Record{
		{Time: now, SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp", Src: "10.88.0.5:40000", DstHost: "pypi.org", QType: "A",
			Action: "allow", Mode: "enforce", Rule: "egress[0]", Reason: "allow pypi.org ports 443 tcp (policy.yaml:12)", PolicyVersion: 3,
			Extra: x("answers", []string{"151.101.0.223", "2a04:4e42::223"}, "rcode", "NOERROR", "ttl_s", 300)},
		{Time: now, SandboxID: "sb1", Source: audit.SourceDNS, Proto: "udp", Src: "10.88.0.5:40001", DstHost: "evil.example", QType: "TXT",
			Action: "deny", Mode: "enforce", Reason: "query type TXT not allowed (allowed: A, AAAA)", PolicyVersion: 3},
		{Time: now, Source: audit.SourceDNS, Proto: "udp", Src: "10.99.0.1:53000", DstHost: "x.example", QType: "A", Action: "deny",
			Reason: "unknown source address"},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", Src: "10.88.0.5:41000", DstIP: "203.0.113.7", DstPort: 443,
			Action: "deny", Mode: "enforce", Rule: "egress[2]", Reason: "default_deny", PolicyVersion: 3,
			Extra: x("backend", "ebpf", "packets", uint64(3), "bytes", uint64(180), "last_seen", now.Add(time.Second).Format(time.RFC3339Nano),
				"process", map[string]any{"pid": uint32(4242), "tid": uint32(4243), "ppid": uint32(4200), "pgid": uint32(4200), "name": "curl",
					"exe": "/usr/bin/curl", "cmdline": "curl -s https://pypi.org/simple/", "ns_pid": 17, "ns_pgid": 15},
				"execution", map[string]any{"by": "group", "pgid": uint32(4200)})},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Proto: "udp", Src: "10.88.0.5", DstIP: "2001:db8::1", DstPort: 53,
			Action: "deny", Reason: "dns_not_resolver", Extra: x("backend", "ebpf", "refused", true, "packets", uint64(1), "bytes", uint64(0))},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", Src: "10.88.0.5:41002", DstIP: "151.101.0.223", DstPort: 443,
			Action: "allow", Mode: "report", WouldDeny: true, Reason: "rule_deny", Extra: x("backend", "nftables")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceBPF, Action: audit.ActionSuppressed,
			Extra: x("suppressed", 12, "last_seen", now.Format(time.RFC3339Nano))},
		{Time: now, SandboxID: "sb1", Source: audit.SourceL7, Proto: "https", Src: "10.88.0.5:41003", DstHost: "pypi.org", DstIP: "151.101.0.223",
			DstPort: 443, Action: "allow", Mode: "enforce", Rule: "egress[0]", Reason: "allow pypi.org", PolicyVersion: 3},
		{Time: now, SandboxID: "sb1", Source: audit.SourceL7, Proto: "http", Src: "10.88.0.5:41004", DstHost: "example.com", DstPort: 80,
			Action: "deny", Rule: "proxy", Reason: "not allowed", PolicyVersion: 3, Extra: x("proxy", "explicit")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceCredential, Proto: "https", Src: "10.88.0.5:41005", DstHost: "api.github.com",
			DstIP: "140.82.112.6", DstPort: 443, Action: "allow", Rule: "github", Reason: "credential injected",
			Extra: x("method", "GET", "path", "/user")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceCredential, Proto: "https", Src: "10.88.0.5:41006", DstHost: "api.github.com",
			DstIP: "140.82.112.6", DstPort: 443, Action: "deny", Reason: "no binding matches",
			Extra: x("method", "PROPFIND", "path", "/x")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceCredential, Action: "allow", Rule: "vault.create",
			Reason: "credential vault create applied: revision 1", Extra: x("credentials", []string{"gh"}, "bindings", []string{"github"})},
		{Time: now, SandboxID: "sb1", Source: audit.SourceCredential, Action: "allow", Rule: "vault.delete",
			Reason: "credential vault delete applied: revision 2", Extra: x("credentials", []string{}, "bindings", []string{})},
		{Time: now, SandboxID: "sb1", Source: audit.SourceGateway, Proto: "http", Src: "192.0.2.10:50000", DstHost: "sb1-8080.sandboxes.example.com:8081",
			DstIP: "10.88.0.5", DstPort: 8080, Action: "allow", Rule: "access:public", Reason: "public",
			Extra: x("route", "host", "status", 200, "bytes", int64(512), "duration_ms", 1.25, "request_id", "req-1", "method", "POST", "result", "proxied")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceIngress, Proto: "https", Src: "[2001:db8::5]:50001", DstHost: "gw.example.com",
			DstPort: 8080, Action: "deny", Rule: "access:token", Reason: "missing token",
			Extra: x("route", "path", "status", 401, "request_id", "req-2", "method", "GET", "result", "unauthorized")},
		{Time: now, SandboxID: "sb2", Source: audit.SourceIngress, Proto: "http", Src: "127.0.0.1:50002", DstHost: "127.0.0.1:8080", DstPort: 3000,
			Action: "deny", Rule: "access:token", Reason: "token required",
			Extra: x("route", "server_proxy", "status", 401, "request_id", "", "method", "GET")},
		{Time: now, SandboxID: "sb1", Source: audit.SourcePolicy, Src: "127.0.0.1:50003", Action: "allow", Reason: "policy changed: put",
			PolicyVersion: 4, Extra: x("change", "put", "route", "PUT /v1/sandboxes/sb1/policy")},
		{Time: now, SandboxID: "sb1", Source: audit.SourcePolicy, Src: "127.0.0.1:50004", Action: "deny",
			Reason: "policy change rejected: bad rule", Extra: x("change", "patch", "route", "PATCH /v1/sandboxes/sb1/policy")},
		{Time: now, Source: audit.SourcePolicy, Action: "allow", PolicyVersion: 2, Reason: "named policy applied: pypi",
			Extra: x("change", "library", "policy", "pypi", "file", "/etc/airlock/policies/pypi.yaml", "sha256", strings.Repeat("a", 64))},
		{Time: now, Source: audit.SourceControl, Proto: "http", Src: "127.0.0.1:50020", Action: "deny", Reason: "sign-in failed: wrong API key",
			Extra: x("op", "console.sign_in", "method", "POST", "path", "/console/login", "status", 401, "outcome", "failure", "entry", "console")},
		{Time: now, Source: audit.SourceControl, Proto: "http", Src: "127.0.0.1:50021", Action: "allow", Reason: "console.sign_out success",
			Extra: x("op", "console.sign_out", "method", "POST", "path", "/console/logout", "status", 204, "outcome", "success",
				"principal", "pk_1", "principal_name", "ops", "role", "operator", "entry", "console")},
		{Time: now, Source: audit.SourceDNS, Action: audit.ActionLoss, Reason: "audit queue full: records dropped", Extra: x("lost", uint64(7))},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "192.0.2.10:50010", Action: "allow",
			Reason: "execd command: exit 0 (success)", Extra: x("op", "command", "entry", "gateway", "request_id", "req-3", "status", 200,
				"duration_ms", 12.5, "command", "pip install requests", "command_sha256", strings.Repeat("c", 64), "command_id", "cmd-1",
				"exit_code", 0, "execution_ms", int64(11), "outcome", "success", "principal", "alice", "cwd", "/workspace")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50011", Action: "allow",
			Reason: "execd command: exit 3 (failure)", Extra: x("op", "command", "entry", "server_proxy", "request_id", "req-4", "status", 200,
				"duration_ms", 3.0, "command_sha256", strings.Repeat("d", 64), "exit_code", 3, "error", "CommandExecError", "outcome", "failure")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50012", Action: "allow",
			Reason: "execd code: NameError (failure)", Extra: x("op", "code", "entry", "server_proxy", "request_id", "req-5", "status", 200,
				"duration_ms", 40.0, "code", "print(x)", "code_sha256", strings.Repeat("e", 64), "language", "python", "error", "NameError",
				"outcome", "failure")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50013", Action: "allow",
			Reason: "execd pty.close (success)", Extra: x("op", "pty.close", "entry", "gateway", "request_id", "req-6", "status", 200,
				"duration_ms", 1.0, "session_id", "pty-1", "outcome", "success")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50014", Action: "allow",
			Reason: "execd file.upload /workspace/a.bin (success)", Extra: x("op", "file.upload", "entry", "gateway", "request_id", "req-7",
				"status", 200, "duration_ms", 5.0, "path", "/workspace/a.bin", "size", int64(800000), "sha256", strings.Repeat("f", 64),
				"mode", "644", "outcome", "success")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50015", Action: "allow",
			Reason: "execd file.move a -> b (success)", Extra: x("op", "file.move", "entry", "gateway", "request_id", "req-8",
				"status", 200, "duration_ms", 1.0, "path", "a", "dest", "b", "outcome", "success")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceExecd, Proto: "http", Src: "127.0.0.1:50016", Action: "allow",
			Reason: "execd dir.delete /workspace/d (failure)", Extra: x("op", "dir.delete", "entry", "gateway", "request_id", "req-9",
				"status", 404, "duration_ms", 1.0, "path", "/workspace/d", "outcome", "failure")},
		{Time: now, SandboxID: "sb3", Source: audit.SourceControl, Proto: "http", Src: "127.0.0.1:50020", Action: "allow",
			Reason: "sandbox.create success", Extra: x("op", "sandbox.create", "method", "POST", "path", "/v1/sandboxes",
				"route", "POST /v1/sandboxes", "request_id", "req-10", "status", 202, "outcome", "success", "duration_ms", 30.5,
				"principal", "admin", "principal_name", "admin (configured key)", "role", "admin")},
		{Time: now, Source: audit.SourceControl, Proto: "https", Src: "[2001:db8::7]:50021", Action: "allow",
			Reason: "key.create success", Extra: x("op", "key.create", "method", "POST", "path", "/v1/keys", "request_id", "req-11",
				"status", 201, "outcome", "success", "principal", "admin", "principal_name", "admin", "role", "admin",
				"target_type", "key", "target", "pk_123")},
		{Time: now, SandboxID: "sb1", Source: audit.SourceControl, Proto: "http", Src: "127.0.0.1:50022", Action: "deny",
			Reason: "sandbox \"sb1\" not found", Extra: x("op", "sandbox.delete", "method", "DELETE", "path", "/v1/sandboxes/sb1",
				"request_id", "req-12", "status", 404, "outcome", "failure", "principal", "pk_u2", "principal_name", "agent b",
				"role", "user", "refusal", "not_owner")},
		{Time: now, Source: audit.SourceControl, Proto: "http", Src: "127.0.0.1:50023", Action: "deny",
			Reason: "missing or invalid API key", Extra: x("op", "api.read", "method", "GET", "path", "/v1/sandboxes",
				"request_id", "req-13", "status", 401, "outcome", "failure", "refusal", "unauthenticated")},
		{Time: now, SandboxID: "sb1", Source: "other", Action: "allow", Reason: "a source this exporter does not know"},
	}
}

// writeLog writes recs through a real audit.Writer with the exporter as its sink
// (files rotated every maxFile bytes) and returns the directory.
func writeLog(t *testing.T, recs []audit.Record, maxFile int64) string {
	t.Helper()
	dir := t.TempDir()
	ex, err := New(Config{ChainDir: dir, Host: "airlock-host"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: dir, Sink: ex, MaxFileBytes: maxFile, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !w.TryAppend(r) {
			t.Fatal("queue full")
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readEvents reads every OCSF file in dir/ocsf, in file order.
func readEvents(t *testing.T, dir string) (events []map[string]any, files []string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, DirName))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		files = append(files, e.Name())
	}
	sort.Strings(files)
	for _, name := range files {
		f, err := os.Open(filepath.Join(dir, DirName, name))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev map[string]any
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("%s: %v: %s", name, err, sc.Bytes())
			}
			events = append(events, ev)
		}
		f.Close()
	}
	return events, files
}

func testSchema(t *testing.T) *schema {
	t.Helper()
	s, err := loadSchema(schemaDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestExportValidatesAgainstSchema: every kind of record, written through the real
// writer, comes out in ocsf/ as events that the schema source validates, of every
// class the package writes, each pointing back to its chain record (seq and hash).
func TestExportValidatesAgainstSchema(t *testing.T) {
	recs := records()
	dir := writeLog(t, recs, 0)
	events, _ := readEvents(t, dir)
	s := testSchema(t)
	chain := map[string]audit.Record{}
	if err := audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
		chain[strconv.FormatUint(r.Seq, 10)] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	seqs := map[string]bool{}
	for i, ev := range events {
		if errs := s.validateEvent(ev, classNamesByUID); len(errs) > 0 {
			b, _ := json.Marshal(ev)
			t.Errorf("event %d invalid:\n  %s\n%s", i, strings.Join(errs, "\n  "), b)
		}
		uid, _ := intOf(ev["class_uid"])
		seen[int(uid)]++
		md := ev["metadata"].(map[string]any)
		seq, _ := md["original_event_uid"].(string)
		r, ok := chain[seq]
		if !ok {
			t.Errorf("event %d: metadata.original_event_uid %q is no chain record", i, seq)
			continue
		}
		if md["correlation_uid"] != r.Hash || ev["unmapped"].(map[string]any)["prev"] != r.Prev {
			t.Errorf("event %d: correlation_uid %v / prev, chain record %d has hash %s", i, md["correlation_uid"], r.Seq, r.Hash)
		}
		seqs[seq] = true
	}
	if len(seqs) != len(recs) || len(chain) != len(recs) {
		t.Errorf("%d records, %d in the chain, %d exported", len(recs), len(chain), len(seqs))
	}
	for uid := range classNamesByUID {
		if seen[uid] == 0 {
			t.Errorf("no event of class %d", uid)
		}
	}
	t.Logf("events by class: %v; schema files read: %d", seen, len(s.used))
	if out := os.Getenv("OCSF_SCHEMA_USED"); out != "" { // the list of files to vendor
		var list []string
		for f := range s.used {
			list = append(list, f)
		}
		sort.Strings(list)
		if err := os.WriteFile(out, []byte(strings.Join(list, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
