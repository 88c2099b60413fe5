package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
)

// TestLifecycleAuditFlags: `airlock lifecycle` without --audit-dir gives the replica no
// audit writer; with it, the writer is the signed chain of that directory (its key
// generated beside it at the first start, files sealed at --audit-max-file-bytes), the agent-action flags reach
// cluster.Config.AgentActions, and closing flushes what was appended: `audit.Verify`
// with the generated public key then checks every checkpoint's signature.
func TestLifecycleAuditFlags(t *testing.T) {
	clearServerEnv(t)
	lf := &lifecycleFlags{}
	if err := lifecycleCommand(lf).ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	c, err := lf.config()
	if err != nil {
		t.Fatal(err)
	}
	closeFn, err := lf.openAudit(&c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Audit != nil || closeFn() != nil {
		t.Fatalf("no --audit-dir: audit writer %v", c.Audit)
	}

	dir := filepath.Join(t.TempDir(), "audit")
	lf = &lifecycleFlags{}
	if err := lifecycleCommand(lf).ParseFlags([]string{"--audit-dir=" + dir, "--audit-max-file-bytes=256", "--audit-hash-commands", "--audit-agent-actions=false"}); err != nil {
		t.Fatal(err)
	}
	if c, err = lf.config(); err != nil {
		t.Fatal(err)
	}
	c.Registry = prometheus.NewRegistry()
	if closeFn, err = lf.openAudit(&c); err != nil {
		t.Fatal(err)
	}
	if c.Audit == nil {
		t.Fatal("--audit-dir: no audit writer in cluster.Config")
	}
	if !c.AgentActions.HashCommands || !c.AgentActions.Disabled {
		t.Errorf("agent-action flags not in cluster.Config: %+v", c.AgentActions)
	}
	want := []string{"sandbox.create", "policy.put", "sandbox.delete"}
	for _, op := range want {
		c.Audit.Append(audit.Record{Time: time.Now(), Source: audit.SourceControl, SandboxID: "sb1", Action: "allow",
			Extra: map[string]any{"op": op, "principal": "p1"}})
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	_, pubPath := audit.DefaultKeyFiles(dir)
	pub, err := audit.LoadPublicKey(pubPath)
	if err != nil {
		t.Fatalf("public key generated at the first start: %v", err)
	}
	rep, err := audit.Verify(dir, audit.VerifyOptions{PublicKey: pub})
	if err != nil {
		t.Fatalf("verify: %v (%+v)", err, rep)
	}
	if rep.Checkpoints == 0 || rep.VerifiedSignatures < rep.Checkpoints || rep.Head == nil || !rep.Head.Signed {
		t.Errorf("checkpoints %d, signatures verified %d, head %+v", rep.Checkpoints, rep.VerifiedSignatures, rep.Head)
	}
	var got []string
	if err := audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
		if r.Source == audit.SourceControl {
			got = append(got, r.Extra["op"].(string))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("control records %q, want %q", got, want)
	}
}
