package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/replay"
	"github.com/airlockdev/airlock/sdk"
)

// The subcommands of `airlock policy` that talk to a server: the library of named
// policies, applying a policy to a sandbox, and replaying a sandbox's traffic.

func addPolicyServerCmds(cmd *cobra.Command) {
	f := &sandboxFlags{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "lifecycle API URL for list, show, apply and test (default $AIRLOCK_SERVER or "+sdk.DefaultBaseURL+")")
	pf.StringVar(&f.apiKey, "api-key", "", "API key (default $OPEN_SANDBOX_API_KEY or the key airlock up stored)")
	cmd.AddCommand(policyList(f), policyShow(f), policyApply(f), policyDiff(f), policyTest(f), policyPropose(f))
}

func policyList(f *sandboxFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List the server's named policies (its policies.dir) with version and users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.NamedPolicies(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(list)
			}
			if len(list) == 0 {
				fmt.Fprintln(out, "no named policies (put one YAML file per policy in the server's policies.dir)")
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tSANDBOXES\tSHA256\tFILE")
			for _, p := range list {
				file := p.File
				if p.Removed {
					file += " (removed: kept for its sandboxes)"
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%.12s\t%s\n", p.Name, p.Version, p.Sandboxes, p.SHA256, file)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func policyShow(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Print a named policy as the server has it in force (its file's text)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			p, err := c.NamedPolicy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# %s version %d, sha256 %s, %s, %d sandboxes\n%s", p.Name, p.Version, p.SHA256, p.File, p.Sandboxes, p.Source)
			return nil
		},
	}
}

func policyApply(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "apply SANDBOX FILE|NAME",
		Short: "Put a sandbox under a policy file or a named policy of the server",
		Long: `With a FILE (a path that exists) the sandbox gets that document as a policy of its own;
with a NAME it runs under the server's named policy and follows its edits. The answer
comes once egressd enforces the new version; an invalid file is rejected whole with its
line and reason and changes nothing.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var p *sdk.PolicyInfo
			if _, statErr := os.Stat(args[1]); statErr == nil {
				doc, err := loadPolicyFile(args[1])
				if err != nil {
					return err
				}
				p, err = c.SetPolicy(cmd.Context(), args[0], doc)
				if err != nil {
					return err
				}
			} else if p, err = c.SetNamedPolicy(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			name := "its own"
			if p.Name != "" {
				name = "named " + p.Name
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: policy %s, version %d, enforced\n", args[0], name, p.Version)
			return nil
		},
	}
}

// loadPolicy reads FILE (a path that exists) or fetches the server's named policy.
func loadPolicy(cmd *cobra.Command, f *sandboxFlags, ref string) (*policies.Policy, error) {
	if data, err := os.ReadFile(ref); err == nil {
		return policies.Parse(ref, data)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	c, err := f.client()
	if err != nil {
		return nil, err
	}
	np, err := c.NamedPolicy(cmd.Context(), ref)
	if err != nil {
		return nil, fmt.Errorf("%s is neither a file nor a named policy of the server: %w", ref, err)
	}
	return policies.Parse(np.Name, []byte(np.Source))
}

func policyDiff(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "diff A B",
		Short: "Compare two policies rule by rule (files, or named policies of the server)",
		Long: `Parses both (a path that exists is a file, anything else a named policy fetched from
the server) and compares them as compiled: settings (default, mode, l7, audit, DNS) and
rules in canonical form (targets normalised, ports and protocols spelled out). Lines:
"- " only in A, "+ " only in B, "~ " in both at another position (first match wins, so
order matters). Exits 0 either way; prints "identical" when nothing differs.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := loadPolicy(cmd, f, args[0])
			if err != nil {
				return err
			}
			b, err := loadPolicy(cmd, f, args[1])
			if err != nil {
				return err
			}
			for _, p := range []*policies.Policy{a, b} {
				if _, err := policies.Compile(p, policies.CompileOptions{Overlay: policies.BaseOverlay()}); err != nil {
					return err
				}
			}
			if n := diffPolicies(cmd.OutOrStdout(), a, b); n == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "identical")
			}
			return nil
		},
	}
}

// diffPolicies prints the differences of a and b and returns how many lines it printed.
func diffPolicies(out io.Writer, a, b *policies.Policy) int {
	n := 0
	line := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		n++
	}
	for _, s := range []struct{ what, a, b string }{
		{"defaultAction", string(a.EffectiveDefault()), string(b.EffectiveDefault())},
		{"mode", string(a.EffectiveMode()), string(b.EffectiveMode())},
		{"l7", string(a.EffectiveL7()), string(b.EffectiveL7())},
		{"audit", string(a.EffectiveAudit()), string(b.EffectiveAudit())},
		{"dns", jsonString(a.DNS), jsonString(b.DNS)},
	} {
		if s.a != s.b {
			line("~ %s: %s -> %s", s.what, s.a, s.b)
		}
	}
	ra, rb := canonicalRules(a), canonicalRules(b)
	for i, r := range ra {
		switch j := slices.Index(rb, r); {
		case j < 0:
			line("- %s", r)
		case j != i:
			line("~ %s (position %d -> %d)", r, i+1, j+1)
		}
	}
	for _, r := range rb {
		if !slices.Contains(ra, r) {
			line("+ %s", r)
		}
	}
	return n
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// canonicalRules spells each rule out: action, normalised target, ports, protocols.
func canonicalRules(p *policies.Policy) []string {
	out := make([]string, 0, len(p.Egress))
	for _, r := range p.Egress {
		target := r.Target
		if t, err := policies.ParseTarget(r.Target); err == nil {
			target = t.String()
		}
		s := string(r.Action) + " " + target
		if len(r.Ports) > 0 {
			ps := make([]string, len(r.Ports))
			for i, pr := range r.Ports {
				ps[i] = pr.String()
			}
			s += " ports " + strings.Join(ps, ",")
		}
		if len(r.Protocols) > 0 {
			ps := make([]string, len(r.Protocols))
			for i, pr := range r.Protocols {
				ps[i] = string(pr)
			}
			s += " " + strings.Join(ps, ",")
		}
		if r.Mode != "" {
			s += " mode " + string(p.RuleMode(&r))
		}
		out = append(out, s)
		if h := r.HTTP; h != nil {
			// One line per HTTP rule and preset, so a changed request rule shows alone.
			for _, hr := range h.Rules {
				out = append(out, fmt.Sprintf("%s http %s", target, jsonString(hr)))
			}
			if h.Access != "" {
				out = append(out, fmt.Sprintf("%s http access %s", target, h.Access))
			}
			for _, g := range h.Git {
				out = append(out, fmt.Sprintf("%s http git %s", target, g))
			}
			out = append(out, fmt.Sprintf("%s http default %s", target, cmp.Or(h.Default, policies.Deny)))
		}
	}
	return out
}

func policyTest(f *sandboxFlags) *cobra.Command {
	var (
		sandbox  string
		since    string
		auditDir string
		asJSON   bool
	)
	c := &cobra.Command{
		Use:   "test FILE|NAME --sandbox ID [--since T]",
		Short: "Replay a sandbox's recorded traffic against a candidate policy",
		Long: `Reads the sandbox's audit records (DNS answers, flows, and the HTTP requests to hosts
with HTTP rules, by method and path) from the server, or from an audit log directory with
--audit-dir, and decides each again with the candidate (a file,
or a named policy of the server), with the built-in operator overlay. Prints what the
candidate would deny that was allowed, and allow that was denied, with counts and the
deciding rule: the safe way to roll out a tighter policy (audit mode is the other).
--since takes an RFC 3339 time or a duration back from now (1h, 30m).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sandbox == "" {
				return errors.New("--sandbox is required")
			}
			from, err := parseSince(since)
			if err != nil {
				return err
			}
			p, err := loadPolicy(cmd, f, args[0])
			if err != nil {
				return err
			}
			d, err := policies.Compile(p, policies.CompileOptions{Overlay: policies.BaseOverlay()})
			if err != nil {
				return err
			}
			recs, err := sandboxRecords(cmd, f, sandbox, from, auditDir)
			if err != nil {
				return err
			}
			rep := replay.Replay(d, recs)
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(rep)
			}
			fmt.Fprintf(out, "%d records, %d DNS answers, flows and HTTP requests replayed, %d unchanged\n", rep.Records, rep.Evaluated, rep.Unchanged)
			for _, part := range []struct {
				title string
				list  []replay.Finding
			}{{"would deny (allowed before)", rep.WouldDeny}, {"would allow (denied before)", rep.WouldAllow}} {
				fmt.Fprintf(out, "\n%s: %d\n", part.title, len(part.list))
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				for _, fd := range part.list {
					target := fd.Target
					if len(fd.Names) > 0 {
						target += " (" + strings.Join(fd.Names, ", ") + ")"
					}
					fmt.Fprintf(tw, "  %s\t%s\t%d×\t%s: %s\n", fd.Kind, target, fd.Count, fd.Rule, fd.Reason)
				}
				tw.Flush()
			}
			return nil
		},
	}
	c.Flags().StringVar(&sandbox, "sandbox", "", "sandbox whose audit records are replayed (required)")
	c.Flags().StringVar(&since, "since", "", "only records from this time (RFC 3339) or this long ago (1h)")
	c.Flags().StringVar(&auditDir, "audit-dir", "", "read an audit log directory instead of asking the server")
	c.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return c
}

// sandboxRecords reads every audit record of sandbox since from (all pages).
func sandboxRecords(cmd *cobra.Command, f *sandboxFlags, sandbox string, from time.Time, dir string) ([]audit.Record, error) {
	if dir != "" {
		recs, _, err := audit.Query(dir, audit.Filter{SandboxID: sandbox, Since: from})
		return recs, err
	}
	c, err := f.client()
	if err != nil {
		return nil, err
	}
	var all []audit.Record
	q := sdk.AuditQuery{Since: from, Limit: 10000}
	for {
		page, err := c.Audit(cmd.Context(), sandbox, q)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Records...)
		if !page.More || len(page.Records) == 0 {
			return all, nil
		}
		q.After = page.Records[len(page.Records)-1].Seq
	}
}
