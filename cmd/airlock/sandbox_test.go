package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/sdk"
)

func TestMain(m *testing.M) {
	lctest.Network = "altest-cli0"
	code := m.Run()
	lctest.RemoveNetwork(lctest.Network)
	os.Exit(code)
}

const cliKey = "cli-test-key"

// runSandbox executes `airlock sandbox args...` in process and returns stdout.
func runSandbox(t *testing.T, h *lctest.Harness, args ...string) string {
	t.Helper()
	cmd := newSandboxCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--server", h.HTTP.URL, "--api-key", cliKey}, args...))
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("airlock sandbox %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

func TestSandboxCLI(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: cliKey})
	var created []sdk.Sandbox
	if err := json.Unmarshal([]byte(runSandbox(t, h, "create", "--json", "--image", h.Image, "--cpu", "500m", "--memory", "256Mi",
		"-m", "team=cli", "-e", "GREETING=hello", "--timeout", "5m")), &created); err != nil {
		t.Fatal(err)
	}
	if len(created) != 1 || created[0].Status.State != "Running" || created[0].Metadata["team"] != "cli" {
		t.Fatalf("create: %+v", created)
	}
	id := created[0].ID
	table := runSandbox(t, h, "ls", "-m", "team=cli")
	if !strings.HasPrefix(table, "ID") || !strings.Contains(table, id) || !strings.Contains(table, "Running") || !strings.Contains(table, "team=cli") {
		t.Errorf("ls table:\n%s", table)
	}
	if out := runSandbox(t, h, "ls", "--state", "Paused"); strings.Contains(out, id) {
		t.Errorf("ls --state Paused lists a running sandbox:\n%s", out)
	}
	if out := runSandbox(t, h, "pause", id); !strings.Contains(out, "Paused") {
		t.Errorf("pause:\n%s", out)
	}
	if out := runSandbox(t, h, "resume", id); !strings.Contains(out, "Running") {
		t.Errorf("resume:\n%s", out)
	}
	if out := runSandbox(t, h, "renew", id, "--for", "1h"); !strings.Contains(out, id+" expires at") {
		t.Errorf("renew: %s", out)
	}
	if out := runSandbox(t, h, "revoke-urls", id); out != id+" signed URLs revoked (epoch 1)\n" {
		t.Errorf("revoke-urls: %q", out)
	}
	if w, _ := h.Server.Hub().Get(id); w.Access.SignedEpoch != 1 {
		t.Errorf("after revoke-urls the watch publishes signed epoch %d, want 1", w.Access.SignedEpoch)
	}
	var got []sdk.Sandbox
	if err := json.Unmarshal([]byte(runSandbox(t, h, "get", id, "--json")), &got); err != nil || got[0].ID != id {
		t.Errorf("get --json: %v %+v", err, got)
	}

	// exec streams output and exits with the command's code: run the real binary.
	bin := lctest.Airlock(t)
	ex := exec.Command(bin, "sandbox", "--server", h.HTTP.URL, "--api-key", cliKey, "exec", id, "--", "echo $GREETING; echo err >&2; exit 3")
	var so, se bytes.Buffer
	ex.Stdout, ex.Stderr = &so, &se
	err := ex.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || so.String() != "hello\n" || se.String() != "err\n" {
		t.Errorf("exec: %v stdout %q stderr %q", err, so.String(), se.String())
	}

	if out := runSandbox(t, h, "rm", id); strings.TrimSpace(out) != id {
		t.Errorf("rm: %q", out)
	}
	cmd := newSandboxCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--server", h.HTTP.URL, "--api-key", cliKey, "get", id})
	if err := cmd.ExecuteContext(t.Context()); !sdk.IsNotFound(err) {
		t.Errorf("get after rm: %v", err)
	}
}

// TestSandboxPolicyCLI: create --policy FILE applies a policy file at create; `sandbox
// policy ID FILE` replaces it (new version); an invalid file is refused here with its line
// and changes nothing.
func TestSandboxPolicyCLI(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: cliKey})
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first := write("first.yaml", "# packages only\ndefaultAction: deny\negress:\n  - action: allow\n    target: pypi.org\n")
	second := write("second.json", `{"defaultAction":"deny","egress":[{"action":"allow","target":"github.com"}]}`)
	bad := write("bad.yaml", "defaultAction: deny\negress:\n  - action: allow\n    target: foo.*.com\n")

	var created []sdk.Sandbox
	if err := json.Unmarshal([]byte(runSandbox(t, h, "create", "--json", "--image", h.Image, "--policy", first)), &created); err != nil {
		t.Fatal(err)
	}
	id := created[0].ID
	policy := func() sdk.PolicyInfo {
		var p sdk.PolicyInfo
		if err := json.Unmarshal([]byte(runSandbox(t, h, "policy", id, "--json")), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := policy(); p.Version != 1 || !strings.Contains(string(p.Policy), "pypi.org") {
		t.Fatalf("policy after create --policy: %+v %s", p, p.Policy)
	}
	if out := runSandbox(t, h, "policy", id, second); !strings.Contains(out, "policy version 2") || !strings.Contains(out, "github.com") {
		t.Errorf("apply: %s", out)
	}
	cmd := newSandboxCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--server", h.HTTP.URL, "--api-key", cliKey, "policy", id, bad})
	if err := cmd.ExecuteContext(t.Context()); err == nil || !strings.Contains(err.Error(), "bad.yaml:4") {
		t.Errorf("invalid file: %v, want an error naming bad.yaml:4", err)
	}
	if p := policy(); p.Version != 2 || !strings.Contains(string(p.Policy), "github.com") {
		t.Errorf("an invalid file changed the policy: %+v %s", p, p.Policy)
	}
}

// runPolicy executes `airlock policy args...` against h and returns stdout and the error.
func runPolicy(t *testing.T, h *lctest.Harness, args ...string) (string, error) {
	t.Helper()
	cmd := newPolicyCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--server", h.HTTP.URL, "--api-key", cliKey))
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// TestPolicyLibraryCLI: list and show the server's named policies, create a sandbox
// under one by name, apply another by name and a file, diff a name with a file, and
// replay the sandbox's (empty) log against a candidate.
func TestPolicyLibraryCLI(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/web.yaml", []byte("defaultAction: deny\negress:\n  - action: allow\n    target: example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/pkgs.yaml", []byte("defaultAction: deny\negress:\n  - action: allow\n    target: pypi.org\n  - action: allow\n    target: Example.COM.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := library.Open(library.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	h := lctest.New(t, lctest.Options{APIKey: cliKey, Library: lib, AuditDir: t.TempDir()})
	out, err := runPolicy(t, h, "list")
	if err != nil || !strings.Contains(out, "pkgs") || !strings.Contains(out, "web") {
		t.Fatalf("policy list: %v\n%s", err, out)
	}
	if out, err := runPolicy(t, h, "show", "web"); err != nil || !strings.Contains(out, "target: example.com") {
		t.Fatalf("policy show: %v\n%s", err, out)
	}
	var created []sdk.Sandbox
	if err := json.Unmarshal([]byte(runSandbox(t, h, "create", "--json", "--no-wait", "--image", h.Image, "--policy", "web")), &created); err != nil {
		t.Fatal(err)
	}
	id := created[0].ID
	if out := runSandbox(t, h, "policy", id); !strings.Contains(out, "named policy web") {
		t.Errorf("sandbox created with --policy web: %s", out)
	}
	if out, err := runPolicy(t, h, "apply", id, "pkgs"); err != nil || !strings.Contains(out, "named pkgs") {
		t.Errorf("policy apply NAME: %v %s", err, out)
	}
	if out, err := runPolicy(t, h, "apply", id, "nope"); err == nil || !strings.Contains(err.Error(), "not in the library") {
		t.Errorf("policy apply of an unknown name: %v %s", err, out)
	}
	own := dir + "/own.json"
	if err := os.WriteFile(own, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"github.com"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runPolicy(t, h, "apply", id, own); err != nil || !strings.Contains(out, "policy its own") {
		t.Errorf("policy apply FILE: %v %s", err, out)
	}
	out, err = runPolicy(t, h, "diff", "web", dir+"/pkgs.yaml")
	if err != nil || !strings.Contains(out, "+ allow pypi.org") || !strings.Contains(out, "~ allow example.com (position 1 -> 2)") {
		t.Errorf("policy diff: %v\n%s", err, out)
	}
	if out, _ := runPolicy(t, h, "diff", "web", "web"); strings.TrimSpace(out) != "identical" {
		t.Errorf("diff of a policy with itself: %q", out)
	}
	if out, err := runPolicy(t, h, "test", "web", "--sandbox", id); err != nil || !strings.Contains(out, "would deny (allowed before): 0") {
		t.Errorf("policy test: %v\n%s", err, out)
	}
}
