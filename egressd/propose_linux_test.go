package egressd

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/propose"
	"github.com/airlockdev/airlock/policies/replay"
	"github.com/airlockdev/airlock/sdk"
)

// TestEgressdPropose is learn → propose → enforce on real sandboxes, on each datapath.
// A sandbox under a narrow policy reaches allowed.test and rules.test (a host with HTTP
// rules: GET /repos/o/r over plain HTTP and HTTPS, intercepted) and is refused a POST
// /api/items. The proposal built from its audit records (package propose) replays
// against those records with nothing allowed becoming denied and the POST allowed;
// applied to the sandbox, the same session passes whole (the POST reaches the server),
// while a host the session never reached (denied.test) and a request it never made
// (DELETE) are refused.
func TestEgressdPropose(t *testing.T) {
	w, writes, intercept := rulesWorld(t, map[string]netip.Addr{
		"rules.test.": rulesIP, "allowed.test.": allowedIP, "denied.test.": deniedIP})
	const learning = `{"defaultAction":"deny","egress":[
	  {"action":"allow","target":"allowed.test"},
	  {"action":"allow","target":"rules.test","http":{"rules":[{"action":"allow","methods":["GET"],"path":"/repos/*"}]}}]}`
	type step struct{ cmd, want string }
	session := []step{
		{"curl -sS -m 5 http://allowed.test/", "allowed"},
		{"curl -sS -m 5 http://rules.test/repos/o/r", "GET /repos/o/r"},
		{"curl -sS -m 5 https://rules.test/repos/o/r", "GET /repos/o/r"},
		{"curl -sS -m 5 -X POST http://rules.test/api/items", "POST /api/items"},
	}
	w.eachBackend(t, learning, func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		for i, s := range session {
			_, out := sh(t, x, s.cmd)
			if ok := out == s.want; ok != (i < 3) {
				t.Errorf("learning: %s = %q (want it to pass: %v)", s.cmd, out, i < 3)
			}
		}
		w.waitAudit(t, sb.ID, "the refused POST", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == "deny" && r.Extra["method"] == "POST"
		})
		w.waitAudit(t, sb.ID, "the HTTPS GET", func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Proto == "https" && r.Action == "allow" && r.Extra["method"] == "GET"
		})
		recs, _, err := audit.Query(w.auditDir, audit.Filter{SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		floor := policies.BaseOverlay()
		floor.DenyAddrs(w.gw, w.gw6)
		res, err := propose.Propose(recs, propose.Options{Floor: floor, Name: "learned"})
		if err != nil {
			t.Fatal(err)
		}
		y, err := res.YAML("learned from " + sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("proposal:\n%s", y)
		p, err := policies.Parse("proposal.yaml", y)
		if err != nil {
			t.Fatal(err)
		}
		var rules *policies.HTTPRules
		for _, r := range p.Egress {
			if r.Target == "denied.test" {
				t.Errorf("the proposal allows denied.test, which the session never asked for")
			}
			if r.Target == "rules.test" && r.HTTP != nil {
				rules = r.HTTP
			}
		}
		if rules == nil || !strings.Contains(string(y), "methods: [POST]") || !strings.Contains(string(y), "path: /api/items") {
			t.Fatalf("the proposal has no HTTP rule for the POST on rules.test:\n%s", y)
		}
		d2, err := policies.Compile(p, policies.CompileOptions{Overlay: floor})
		if err != nil {
			t.Fatal(err)
		}
		if rep := replay.Replay(d2, recs); len(rep.WouldDeny) != 0 {
			t.Errorf("replay: the proposal would deny what the session was allowed: %+v", rep.WouldDeny)
		}
		doc, _ := json.Marshal(p)
		w.putPolicy(t, sb.ID, string(doc))
		before := writes.Load()
		for _, s := range session {
			if _, out := sh(t, x, s.cmd); out != s.want {
				t.Errorf("under the proposal: %s = %q, want %q", s.cmd, out, s.want)
			}
		}
		if writes.Load() != before+1 {
			t.Errorf("the server saw %d writes under the proposal, want the POST", writes.Load()-before)
		}
		if out := curl(t, x, "http://denied.test/"); out != "" {
			t.Errorf("under the proposal a new host answered: %q", out)
		}
		if _, out := sh(t, x, "curl -sS -m 5 -X DELETE http://rules.test/repos/o/r"); !strings.Contains(out, `"rule":"egress[`) {
			t.Errorf("under the proposal DELETE (never made) = %q, want 403 naming the rule", out)
		}
	}, intercept)
}
