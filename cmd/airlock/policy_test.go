package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func run(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

func TestPolicyValidateShippedExamples(t *testing.T) {
	out, err := run(t, newPolicyCmd(), "validate", "../../deploy/policies", "../../deploy/policies/overlays")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if n := strings.Count(out, ": ok: "); n < 6 {
		t.Errorf("%d files ok:\n%s", n, out)
	}
}

func TestPolicyValidateReportsLineAndFails(t *testing.T) {
	out, err := run(t, newPolicyCmd(), "validate", "../../deploy/policies/default-deny.yaml", "../../policies/testdata/invalid/mid-wildcard.yaml")
	if err == nil || !strings.Contains(err.Error(), "1 of 2 files invalid") {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(out, `mid-wildcard.yaml:4:13: egress[0].target: invalid wildcard "foo.*.com"`) {
		t.Errorf("output lacks the located error:\n%s", out)
	}
}

func TestPolicyExplain(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"../../deploy/policies/github-readonly.yaml", "gist.github.com", "--port", "443", "--proto", "tcp"},
			[]string{"decision: deny", "rule:     egress[0]", "* egress[0]", "shadowed"}},
		{[]string{"../../deploy/policies/python-packages.yaml", "files.pythonhosted.org"},
			[]string{"decision: allow", "reach:    tcp:443"}},
		{[]string{"../../deploy/policies/opensandbox-network-policy.json", "example.org"},
			[]string{"decision: allow", "egress[3]"}},
		{[]string{"../../deploy/policies/opensandbox-network-policy.json", "www.example.org"},
			[]string{"decision: deny", "egress[2]"}},
		{[]string{"--overlay", "../../deploy/policies/overlays/operator.yaml", "../../deploy/policies/report-rollout.yaml", "169.254.169.254"},
			[]string{"class link-local", "decision: deny", "overlay.alwaysDeny[0]"}},
		{[]string{"../../deploy/policies/report-rollout.yaml", "unknown.example.net"},
			[]string{"decision: allow (audit mode: would_deny, enforce would deny)", "mode:     policy audit"}},
		{[]string{"../../deploy/policies/github-readonly.yaml", "10.40.1.2", "--port", "22"},
			[]string{"class private", "rule:     guard"}},
	}
	for _, c := range cases {
		out, err := run(t, newPolicyCmd(), append([]string{"explain"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

func TestPolicyExplainHTTP(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"../../deploy/policies/github-http.yaml", "DELETE", "https://api.github.com/repos/o/r"},
			[]string{"http decision: deny", "http rule:     egress[1].http.rules[0]", "* egress[1].http.rules[0]"}},
		{[]string{"../../deploy/policies/github-http.yaml", "get", "https://api.github.com/repos/o/r"},
			[]string{"http decision: allow", "http rule:     egress[1].http.access"}},
		{[]string{"../../deploy/policies/github-http.yaml", "POST", "https://github.com/o/r.git/git-receive-pack"},
			[]string{"http decision: deny", "http rule:     egress[0].http.default"}},
		{[]string{"../../deploy/policies/github-http.yaml", "GET", "https://github.com/o/r.git/info/refs?service=git-upload-pack"},
			[]string{"http decision: allow", "egress[0].http.git.fetch"}},
		{[]string{"../../deploy/policies/github-http.yaml", "GET", "https://objects.githubusercontent.com/x"},
			[]string{"the host has no HTTP rules"}},
		{[]string{"../../deploy/policies/github-http.yaml", "GET", "https://gist.github.com/x"},
			[]string{"the host is denied"}},
	}
	for _, c := range cases {
		out, err := run(t, newPolicyCmd(), append([]string{"explain"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	if _, err := run(t, newPolicyCmd(), "explain", "../../deploy/policies/github-http.yaml", "GET", "ftp://x/"); err == nil {
		t.Error("explain accepted an ftp URL")
	}
}

func TestPolicyValidateHTTPRules(t *testing.T) {
	out, err := run(t, newPolicyCmd(), "validate", "../../policies/testdata/invalid/http-bad-path.yaml")
	if err == nil || !strings.Contains(out, `http-bad-path.yaml:6:32: egress[0].http.rules[0].path: path "/repos/../user" is not canonical`) {
		t.Fatalf("err = %v\n%s", err, out)
	}
	out, err = run(t, newPolicyCmd(), "validate", "../../deploy/policies/github-http.yaml")
	if err != nil || !strings.Contains(out, "http rules on 2 hosts") {
		t.Fatalf("err = %v\n%s", err, out)
	}
}

// TestPolicyModes: validate, explain and diff show the enforcement mode of the policy
// and of its rules.
func TestPolicyModes(t *testing.T) {
	const file = "../../deploy/policies/audit-rules.yaml"
	out, err := run(t, newPolicyCmd(), "validate", file)
	if err != nil || !strings.Contains(out, "mode enforce") || !strings.Contains(out, "2 rules in audit") {
		t.Errorf("validate: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{file, "files.pythonhosted.org", "--port", "443", "--proto", "tcp"},
			[]string{"decision: allow (audit mode: would_deny", "mode:     policy enforce, rule egress[1] audit", "rule:     egress[1]"}},
		{[]string{file, "169.254.169.254"}, []string{"decision: deny", "platform floor (overlay.alwaysDeny[0]) is enforced in every mode"}},
		{[]string{file, "DELETE", "https://api.github.com/repos/o/r"},
			[]string{"http decision: allow (audit mode: would_deny", "http rule:     egress[2].http.rules[0]"}},
		{[]string{file, "POST", "https://api.github.com/repos/o/r"},
			[]string{"http decision: deny", "http mode:     enforce", "http rule:     egress[2].http.default"}},
	} {
		out, err := run(t, newPolicyCmd(), append([]string{"explain"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(a, []byte("egress: [{action: deny, target: x.test, mode: audit}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("mode: audit\negress: [{action: deny, target: x.test}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, newPolicyCmd(), "diff", a, b)
	for _, w := range []string{"~ mode: enforce -> audit", "- deny x.test mode audit", "+ deny x.test"} {
		if err != nil || !strings.Contains(out, w) {
			t.Errorf("diff lacks %q: %v\n%s", w, err, out)
		}
	}
}
