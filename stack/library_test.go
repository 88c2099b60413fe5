package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// TestStackPolicyLibrary: sandboxes run under named policies from files. A valid edit
// reaches the running sandbox (enforced, audited with name, version and SHA-256); a
// broken edit is rejected whole with file:line:col, audited, and the previous version
// stays; additions (PATCH) combine with the named policy and survive its edits; the
// operator default applies to a create without a policy; concurrent edits and PATCHes
// lose nothing.
func TestStackPolicyLibrary(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	zone := map[string]netip.Addr{}
	for i, n := range []string{"a.test.", "b.test.", "c.test.", "d.test."} {
		zone[n] = netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)})
	}
	resolver := dnstest.Serve(t, dnstest.Zone(zone, 60))
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		// Like an editor: a temporary file renamed over the old one.
		f, err := os.CreateTemp(dir, ".tmp-*")
		if err == nil {
			_, err = f.WriteString(body)
			f.Close()
		}
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, name))
		}
		if err != nil {
			t.Error(err)
		}
	}
	allow := func(targets ...string) string {
		var b strings.Builder
		b.WriteString("defaultAction: deny\negress:\n")
		for _, tg := range targets {
			fmt.Fprintf(&b, "  - action: allow\n    target: %s\n", tg)
		}
		return b.String()
	}
	write("team.yaml", allow("a.test"))
	write("fallback.yaml", allow("d.test"))
	s, c := startTestStack(t, func(cfg *Config) {
		cfg.Gateway = GatewayConfig{Disabled: true}
		cfg.Egress.Upstreams = []string{resolver}
		cfg.Policies = PoliciesConfig{Dir: dir, Default: "fallback"}
	})
	auditDir := s.cfg.Audit.Dir
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	start := func(req sdk.CreateRequest) (*sdk.Sandbox, *sdk.Execd) {
		t.Helper()
		req.Image, req.Timeout = img, 10*time.Minute
		sb, err := c.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		x, err := c.Execd(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return sb, x
	}
	// resolvable lists which of a..d.test resolve in the sandbox.
	resolvable := func(x *sdk.Execd) string {
		t.Helper()
		ex, err := x.Run(ctx, sdk.Command{Command: `for n in a b c d; do getent hosts $n.test >/dev/null && printf $n; done; echo`}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(ex.Stdout, "")
	}
	// eventually waits (bounded) until the sandbox resolves want.
	eventually := func(x *sdk.Execd, want string) {
		t.Helper()
		got := ""
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = resolvable(x); got == want {
				return
			}
		}
		t.Fatalf("the sandbox resolves %q, want %q", got, want)
	}
	// auditHas waits for a library record of policy name matching ok.
	auditHas := func(name string, ok func(audit.Record) bool) audit.Record {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			recs, _, err := audit.Query(auditDir, audit.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Source == audit.SourcePolicy && r.Extra["policy"] == name && ok(r) {
					return r
				}
			}
		}
		t.Fatalf("no matching audit record for policy %s", name)
		return audit.Record{}
	}

	named, x := start(sdk.CreateRequest{Extensions: map[string]string{"airlock.dev/policy": "team"}})
	if got := resolvable(x); got != "a" {
		t.Fatalf("under team v1 the sandbox resolves %q, want a", got)
	}
	info, err := c.Policy(ctx, named.ID)
	if err != nil || info.Name != "team" {
		t.Fatalf("policy of %s: %+v %v", named.ID, info, err)
	}
	v1 := info.Version

	// A valid edit reaches the running sandbox.
	write("team.yaml", allow("a.test", "b.test"))
	eventually(x, "ab")
	applied := auditHas("team", func(r audit.Record) bool { return r.Action == "allow" && r.PolicyVersion == 2 })
	if sha, _ := applied.Extra["sha256"].(string); len(sha) != 64 {
		t.Errorf("applied record without the file's SHA-256: %+v", applied)
	}
	if info, _ := c.Policy(ctx, named.ID); info.Version <= v1 {
		t.Errorf("version after the edit %d, want > %d", info.Version, v1)
	}

	// A broken edit is rejected whole; v2 stays.
	write("team.yaml", allow("a.test", "b.test")+"  - action: allow\n    target: \"c.*.test\"\n")
	rejected := auditHas("team", func(r audit.Record) bool { return r.Action == "deny" })
	if !regexp.MustCompile(regexp.QuoteMeta(filepath.Join(dir, "team.yaml")) + `:\d+:\d+: `).MatchString(rejected.Reason) {
		t.Errorf("rejection without file:line:col: %q", rejected.Reason)
	}
	if got := resolvable(x); got != "ab" {
		t.Errorf("after a broken edit the sandbox resolves %q, want ab (v2 in force)", got)
	}

	// Additions: first in line, kept across edits of the named policy.
	if _, err := c.PatchPolicy(ctx, named.ID, json.RawMessage(`[{"action":"allow","target":"c.test"}]`)); err != nil {
		t.Fatal(err)
	}
	eventually(x, "abc")
	write("team.yaml", allow("a.test"))
	eventually(x, "ac")
	if info, _ := c.Policy(ctx, named.ID); info.Name != "team" {
		t.Errorf("after a PATCH the sandbox left its named policy: %+v", info)
	}

	// The operator default, and additions given at create.
	_, dx := start(sdk.CreateRequest{})
	if got := resolvable(dx); got != "d" {
		t.Errorf("the default policy: resolves %q, want d", got)
	}
	_, ax := start(sdk.CreateRequest{Extensions: map[string]string{"airlock.dev/policy": "team"},
		NetworkPolicy: json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"b.test"}]}`)})
	if got := resolvable(ax); got != "ab" {
		t.Errorf("team with additions at create: resolves %q, want ab", got)
	}
	if _, err := c.Create(ctx, sdk.CreateRequest{Image: img, Extensions: map[string]string{"airlock.dev/policy": "nope"}}); err == nil ||
		!strings.Contains(err.Error(), "not in the library") {
		t.Errorf("create naming an unknown policy: %v", err)
	}

	// Concurrent edits and PATCHes: the last edit and every PATCH are in force.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			body := allow("a.test")
			if i == 4 {
				body = allow("a.test", "b.test")
			}
			write("team.yaml", body)
			time.Sleep(30 * time.Millisecond)
		})
	}
	wg.Wait()
	write("team.yaml", allow("a.test", "b.test")) // the last word, after the race
	for _, tg := range []string{"c.test", "d.test"} {
		wg.Go(func() {
			if _, err := c.PatchPolicy(ctx, named.ID, json.RawMessage(`[{"action":"allow","target":"`+tg+`"}]`)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	eventually(x, "abcd")
	np, err := c.NamedPolicies(ctx)
	if err != nil || !slices.ContainsFunc(np, func(p sdk.NamedPolicy) bool { return p.Name == "team" && p.Sandboxes == 2 }) {
		t.Errorf("library listing: %+v %v", np, err)
	}
}
