package console

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/principal"
)

// TestAuditorSeesControlRecordsAndTimeline: an auditor key signs in, sees the audit
// page and finds control-plane records by source and principal there (a user is
// refused); the sandbox page's timeline lists each execd command followed by the
// flows it opened: by extra.execution when a flow names one (even outside the
// command's time window), else by the command's time window; a flow outside every
// command is counted as unlinked.
func TestAuditorSeesControlRecordsAndTimeline(t *testing.T) {
	keys, err := principal.NewKeyring(nil, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	aud, _ := keys.Create(principal.CreateRequest{Name: "compliance", Role: principal.Auditor})
	user, _ := keys.Create(principal.CreateRequest{Name: "agent", Role: principal.User})
	dir := t.TempDir()
	aw, err := audit.New(audit.Config{Dir: dir, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Close()
	con, err := New(Config{API: &fakeAPI{}, APIKey: testKey, Authenticate: keys.Authenticate, AuditDir: dir, SessionTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	h := &harness{t: t, con: con, srv: srv, dir: dir}

	t0 := time.Now().Add(-10 * time.Minute).UTC()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	recs := []audit.Record{
		{Time: at(0), SandboxID: "sb1", Source: audit.SourceControl, Action: "allow", Reason: "sandbox.create success",
			Extra: map[string]any{"op": "sandbox.create", "principal": user.ID, "status": 202, "request_id": "r0"}},
		{Time: at(1), SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "192.0.2.1", DstPort: 80, Action: "allow"}, // entrypoint
		{Time: at(10), SandboxID: "sb1", Source: audit.SourceExecd, Action: "allow",
			Extra: map[string]any{"op": "command", "command": "curl https://example.com", "command_id": "c1", "request_id": "r1", "duration_ms": 2000.0, "exit_code": 0}},
		{Time: at(10.5), SandboxID: "sb1", Source: audit.SourceDNS, QType: "A", DstHost: "example.com", Action: "allow"},
		{Time: at(11), SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "93.184.216.34", DstPort: 443, Action: "allow"},
		{Time: at(20), SandboxID: "sb1", Source: audit.SourceExecd, Action: "allow",
			Extra: map[string]any{"op": "code", "code": "import urllib.request", "request_id": "r2", "duration_ms": 1000.0}},
		{Time: at(20.5), SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "151.101.0.223", DstPort: 443, Action: "deny"},
		// a background process the first command started, still attributed to it
		{Time: at(40), SandboxID: "sb1", Source: audit.SourceBPF, Proto: "tcp", DstIP: "198.51.100.9", DstPort: 22, Action: "deny",
			Extra: map[string]any{"execution": map[string]any{"command_id": "c1"}, "process": map[string]any{"exe": "/usr/bin/ssh"}}},
		{Time: at(50), SandboxID: "sb1", Source: audit.SourceControl, Action: "deny", Reason: "sandbox \"sb1\" not found",
			Extra: map[string]any{"op": "sandbox.delete", "principal": "pk_other", "status": 404, "refusal": "not_owner"}},
	}
	for _, r := range recs {
		aw.Append(r)
	}
	waitWritten(t, aw, uint64(len(recs)))

	uc := h.client()
	h.login(uc, user.Key)
	if resp, b := h.do(uc, "GET", "/console/api/audit?source=control", "", nil); resp.StatusCode != 403 {
		t.Fatalf("audit search as a user: %d %s, want 403", resp.StatusCode, b)
	}

	ac := h.client()
	if resp := h.login(ac, aud.Key); resp.StatusCode != 303 {
		t.Fatalf("auditor sign-in: %d", resp.StatusCode)
	}
	if resp, page := h.do(ac, "GET", "/console/audit", "", nil); resp.StatusCode != 200 || !strings.Contains(string(page), `<option>control</option>`) ||
		!strings.Contains(string(page), `id="s-principal"`) {
		t.Fatalf("the auditor's audit page (%d) lacks the control source or the principal field:\n%s", resp.StatusCode, page)
	}
	var res struct{ Records []audit.Record }
	resp, b := h.do(ac, "GET", "/console/api/audit?source=control", "", nil)
	if json.Unmarshal(b, &res); resp.StatusCode != 200 || len(res.Records) != 2 || res.Records[0].Extra["op"] != "sandbox.create" {
		t.Fatalf("control records as an auditor: %d %s", resp.StatusCode, b)
	}
	resp, b = h.do(ac, "GET", "/console/api/audit?principal=pk_other", "", nil)
	if json.Unmarshal(b, &res); resp.StatusCode != 200 || len(res.Records) != 1 || res.Records[0].Action != "deny" {
		t.Fatalf("records of principal pk_other: %d %s", resp.StatusCode, b)
	}

	var tl TimelineResponse
	resp, b = h.do(ac, "GET", "/console/api/sandboxes/sb1/timeline", "", nil)
	if err := json.Unmarshal(b, &tl); err != nil || resp.StatusCode != 200 || len(tl.Entries) != 2 {
		t.Fatalf("timeline: %d %s", resp.StatusCode, b)
	}
	seqs := func(e TimelineEntry) (out []uint64) {
		for _, f := range e.Flows {
			out = append(out, f.Seq)
		}
		return out
	}
	if e := tl.Entries[0]; e.Command.Extra["command"] != "curl https://example.com" || e.LinkedBy != "execution" ||
		len(e.Flows) != 3 || e.Flows[0].Source != audit.SourceDNS || e.Flows[2].DstPort != 22 {
		t.Errorf("first command's entry: %+v flows %v", e.Command.Extra, seqs(e))
	}
	if e := tl.Entries[1]; e.Command.Extra["op"] != "code" || e.LinkedBy != "time" || len(e.Flows) != 1 || e.Flows[0].DstIP != "151.101.0.223" {
		t.Errorf("second command's entry: %+v flows %v", e.Command.Extra, seqs(e))
	}
	if tl.Unlinked != 1 {
		t.Errorf("unlinked %d, want 1 (the entrypoint's flow)", tl.Unlinked)
	}
	if resp, _ := h.do(ac, "GET", "/console/api/sandboxes/nosuch/timeline", "", nil); resp.StatusCode != 404 {
		t.Errorf("timeline of an unknown sandbox: %d, want 404", resp.StatusCode)
	}
	if resp, page := h.do(ac, "GET", "/console/static/timeline.js", "", nil); resp.StatusCode != 200 || !strings.Contains(string(page), "/timeline") {
		t.Errorf("timeline.js: %d", resp.StatusCode)
	}
}

// TestTimelineByProcessGroup: flows whose process the kernel saw in a command's process
// group (egressd's extra.execution.pgid, the command record's extra.process_group.pgid)
// go to that command even when they come after it ended (a background job), and to the
// latest command with that group when a group id is reused; a flow of the entrypoint
// goes to no command, even inside a command's time window.
func TestTimelineByProcessGroup(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	cmd := func(seq uint64, at time.Duration, pgid float64) audit.Record {
		return audit.Record{Seq: seq, Time: t0.Add(at), Source: audit.SourceExecd,
			Extra: map[string]any{"op": "command", "duration_ms": 100.0, "process_group": map[string]any{"pgid": pgid}}}
	}
	flow := func(seq uint64, at time.Duration, by string, pgid float64) audit.Record {
		return audit.Record{Seq: seq, Time: t0.Add(at), Source: audit.SourceBPF,
			Extra: map[string]any{"execution": map[string]any{"by": by, "pgid": pgid}}}
	}
	cmds := []audit.Record{cmd(1, 0, 40), cmd(2, time.Second, 41), cmd(3, 3*time.Second, 40)}
	flows := []audit.Record{
		flow(10, 50*time.Millisecond, "group", 40),   // the first command's
		flow(11, 2*time.Second, "group", 41),         // the second's background job, after it ended
		flow(12, 3050*time.Millisecond, "group", 40), // group 40 again: the third command's
		flow(13, 1050*time.Millisecond, "entrypoint", 1),
	}
	entries := buildTimeline(cmds, flows)
	want := [][]uint64{{10}, {11}, {12}} // 13 is the entrypoint's: no command's
	for i, e := range entries {
		var got []uint64
		for _, f := range e.Flows {
			got = append(got, f.Seq)
		}
		if !slices.Equal(got, want[i]) {
			t.Errorf("command %d: flows %v, want %v", i+1, got, want[i])
		}
	}
	if entries[0].LinkedBy != "process_group" || entries[2].LinkedBy != "process_group" {
		t.Errorf("linked by %q, %q, want process_group", entries[0].LinkedBy, entries[2].LinkedBy)
	}
}
