package stack

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// TestStackPolicyProposalIntoLibrary: learn → propose → enforce on airlock up. A
// sandbox under a deny policy is refused a name (egressd's DNS filter) and a
// connection to this host's own address (the floor); its pending proposal, built by
// lifecycle from egressd's real records, proposes the name and leaves the host's
// address out (the floor of this host: lifecycle gets egressd's overlay). Approved
// with saveAs, the policy is written into the library directory, the library serves
// it (its own audit record), the sandbox runs under it and resolves the name; the
// decision's control record names the principal and the policy.
func TestStackPolicyProposalIntoLibrary(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	var hostAddr netip.Addr
	for _, a := range egressd.HostAddrs() {
		if a.Is4() && !a.IsLoopback() && !a.IsPrivate() {
			hostAddr = a
			break
		}
	}
	for _, a := range egressd.HostAddrs() {
		if !hostAddr.IsValid() && a.Is4() && !a.IsLoopback() {
			hostAddr = a
		}
	}
	if !hostAddr.IsValid() {
		t.Fatalf("no IPv4 address of this host besides loopback: %v", egressd.HostAddrs())
	}
	resolver := dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{"learned.test.": netip.MustParseAddr("203.0.113.40")}, 60))
	dir := t.TempDir()
	s, c := startTestStack(t, func(cfg *Config) {
		cfg.Gateway = GatewayConfig{Disabled: true}
		cfg.Egress.Upstreams = []string{resolver}
		cfg.Policies = PoliciesConfig{Dir: dir}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, Timeout: 10 * time.Minute,
		NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}`)})
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
	resolves := func() bool {
		ex, err := x.Run(ctx, sdk.Command{Command: "getent hosts learned.test >/dev/null && echo yes || echo no"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(strings.Join(ex.Stdout, "")) == "yes"
	}
	if resolves() {
		t.Fatal("learned.test resolves under the deny policy")
	}
	if _, err := x.Run(ctx, sdk.Command{Command: "timeout 3 bash -c '</dev/tcp/" + hostAddr.String() + "/8080' 2>/dev/null; echo done"}, nil); err != nil {
		t.Fatal(err)
	}

	// The proposal, once egressd's records of both refusals are in the log.
	var p *sdk.Proposal
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if p, err = c.PolicyProposal(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if p.Pending && strings.Contains(p.YAML, "target: learned.test") && slices.ContainsFunc(p.Skipped, func(k sdk.ProposalSkip) bool { return k.Target == hostAddr.String() }) {
			break
		}
		if strings.Contains(p.YAML, "target: "+hostAddr.String()) {
			t.Fatalf("the proposal allows this host's own address %s (the floor lifecycle uses is not this host's):\n%s", hostAddr, p.YAML)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no proposal of learned.test with %s skipped by the floor: %+v\n%s", hostAddr, p.Skipped, p.YAML)
		}
	}

	info, err := c.DecideProposal(ctx, sb.ID, sdk.ProposalDecision{Decision: "approve", Digest: p.Digest, SaveAs: "learned"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "learned" {
		t.Errorf("after the approval the sandbox runs under %q, want learned", info.Name)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "learned.yaml")); err != nil || string(b) != p.YAML {
		t.Errorf("learned.yaml (%v) is not the approved proposal:\n%s", err, b)
	}
	if np, ok := s.Library.Get("learned"); !ok || np.Version != 1 {
		t.Errorf("the library does not serve learned: %+v", np)
	}
	if !resolves() {
		t.Error("after the approval learned.test does not resolve in the sandbox")
	}
	var library, control bool
	for deadline := time.Now().Add(5 * time.Second); !(library && control) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		recs, _, err := audit.Query(s.cfg.Audit.Dir, audit.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			library = library || r.Source == audit.SourcePolicy && r.Extra["change"] == "library" && r.Extra["policy"] == "learned"
			control = control || r.Source == audit.SourceControl && r.Extra["op"] == "policy.proposal" && r.Extra["target"] == "learned" &&
				r.Extra["principal"] == "admin" && r.Extra["decision"] == "approve"
		}
	}
	if !library || !control {
		t.Errorf("audit: library record %v, control record of the approval %v", library, control)
	}
}
