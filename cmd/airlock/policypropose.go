package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/propose"
)

// policyPropose is `airlock policy propose`: a policy learned from a sandbox's audit
// records (package policies/propose).
func policyPropose(f *sandboxFlags) *cobra.Command {
	var (
		sandbox, since, base, auditDir, out string
		minSiblings, minPaths               int
		asJSON                              bool
		decide                              proposalDecision
	)
	c := &cobra.Command{
		Use:   "propose --sandbox ID [--since T] [--base FILE|NAME|current] | propose --sandbox ID --approve|--reject|--write NAME [--replace]",
		Short: "Propose a minimal policy from what a sandbox did (its audit records)",
		Long: `Reads the sandbox's audit records (DNS answers, flows, L7 decisions and the HTTP
requests to hosts with HTTP rules) from the server, or from an audit log directory with
--audit-dir, and proposes the policy that would have allowed exactly what the sandbox did:
what was allowed, denied or would-deny (report/audit mode) alike. Each name or address
gets an allow rule with the ports and protocols seen; names only asked in DNS get every
port; at least --min-siblings names under one parent become one wildcard; a host whose
requests were checked gets HTTP rules with the methods seen per path, paths sharing a
first segment becoming a prefix once --min-paths distinct ones were seen. Destinations
in the platform floor (cloud metadata, loopback, link-local, this host's addresses) are
never proposed: they are listed at the end.

With --base (a file, a named policy of the server, or "current": the sandbox's own
policy) the proposal is the base with a rule, first, for each destination the base did
not allow, and the differences are printed before it.

The output is the policy in the library's YAML, each rule with its counts (records
seen, refused then); save it with -o, check it with "airlock policy test FILE
--sandbox ID" (it allows everything that was refused and denies nothing that was
allowed) and apply it with "airlock policy apply ID FILE" or put it in policies.dir.
--since takes an RFC 3339 time or a duration back from now (1h, 30m).

With --approve, --reject or --write NAME the command decides the server's pending
proposal for the sandbox instead (the one the console shows: its refusals since the
last decision, on top of its current policy): it prints it, then approves it (applied
to the sandbox), rejects it, or with --write approves it into the server's policy
library as NAME.yaml (admin and operator keys; a name taken is refused unless
--replace) and puts the sandbox under that named policy. Every decision is audited
with the key's principal.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sandbox == "" {
				return errors.New("--sandbox is required")
			}
			if decide.wanted() || decide.replace {
				return decideProposal(cmd, f, sandbox, decide)
			}
			from, err := parseSince(since)
			if err != nil {
				return err
			}
			opts := propose.Options{MinSiblings: minSiblings, MinPaths: minPaths, Name: "proposed-" + sandbox}
			ov := policies.BaseOverlay()
			ov.DenyAddrs(egressd.HostAddrs()...)
			opts.Floor = ov
			if base != "" {
				if opts.Base, err = loadBase(cmd, f, base, sandbox); err != nil {
					return err
				}
			}
			recs, err := sandboxRecords(cmd, f, sandbox, from, auditDir)
			if err != nil {
				return err
			}
			res, err := propose.Propose(recs, opts)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(w).Encode(res)
			}
			header := fmt.Sprintf("Proposed by airlock policy propose for sandbox %s from %d records (%d DNS answers, flows and L7 decisions).", sandbox, res.Records, res.Used)
			if opts.Base != nil {
				header += "\nBase: " + base + "; rules marked new are added first."
			}
			y, err := res.YAML(header)
			if err != nil {
				return err
			}
			if opts.Base != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "changes against %s:\n", base)
				if diffPolicies(cmd.ErrOrStderr(), opts.Base, res.Policy) == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "none: the base allows everything the sandbox did")
				}
			}
			tw := tabwriter.NewWriter(cmd.ErrOrStderr(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RULE\tTARGET\tSCOPE\tSEEN\tREFUSED\tNEW")
			for _, r := range res.Rules {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%v\n", r.Rule, r.Target, r.Scope, r.Seen, r.Refused, r.New)
			}
			tw.Flush()
			if out != "" {
				if err := os.WriteFile(out, y, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
				return nil
			}
			_, err = w.Write(y)
			return err
		},
	}
	c.Flags().StringVar(&sandbox, "sandbox", "", "sandbox whose audit records are read (required)")
	c.Flags().StringVar(&since, "since", "", "only records from this time (RFC 3339) or this long ago (1h)")
	c.Flags().StringVar(&base, "base", "", `extend this policy: a file, a named policy of the server, or "current" (the sandbox's)`)
	c.Flags().StringVar(&auditDir, "audit-dir", "", "read an audit log directory instead of asking the server")
	c.Flags().StringVarP(&out, "output", "o", "", "write the proposal to this file instead of stdout")
	c.Flags().IntVar(&minSiblings, "min-siblings", propose.DefaultMinSiblings, "names under one parent that become a wildcard (negative: never)")
	c.Flags().IntVar(&minPaths, "min-paths", propose.DefaultMinPaths, "paths under one first segment that become a prefix (negative: never)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the proposal and its report as JSON")
	c.Flags().BoolVar(&decide.approve, "approve", false, "approve the server's pending proposal: apply it to the sandbox")
	c.Flags().BoolVar(&decide.reject, "reject", false, "reject the server's pending proposal")
	c.Flags().StringVar(&decide.write, "write", "", "approve the server's pending proposal into its policy library as NAME and put the sandbox under it")
	c.Flags().BoolVar(&decide.replace, "replace", false, "with --write: replace the library's policy NAME")
	return c
}

// loadBase reads --base: "current" is the sandbox's policy on the server, anything
// else a file or a named policy (loadPolicy).
func loadBase(cmd *cobra.Command, f *sandboxFlags, ref, sandbox string) (*policies.Policy, error) {
	if ref != "current" {
		return loadPolicy(cmd, f, ref)
	}
	c, err := f.client()
	if err != nil {
		return nil, err
	}
	info, err := c.Policy(cmd.Context(), sandbox)
	if err != nil {
		return nil, err
	}
	if len(info.Policy) == 0 || string(info.Policy) == "null" {
		return nil, fmt.Errorf("sandbox %s has no policy of its own (the operator's default applies): propose without --base", sandbox)
	}
	return policies.Parse(sandbox+" (current)", info.Policy)
}

// parseSince reads --since: an RFC 3339 time or a duration back from now; "" is the
// zero time (everything).
func parseSince(since string) (time.Time, error) {
	if since == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(since); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 1h", since)
	}
	return t, nil
}
