package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/sdk"
)

// proposalDecision is what `airlock policy propose` decides on the server's pending
// proposal (--approve, --reject, --write NAME [--replace]).
type proposalDecision struct {
	approve, reject, replace bool
	write                    string
}

// wanted reports whether the flags ask for a decision on the server's proposal.
func (d proposalDecision) wanted() bool { return d.approve || d.reject || d.write != "" }

// localFlags are propose's flags that shape a proposal computed here; the server's
// pending proposal is decided as the server computed it, so they do not combine with a
// decision.
var localFlags = []string{"since", "base", "audit-dir", "output", "min-siblings", "min-paths", "json"}

// decideProposal reads the sandbox's pending proposal from the server, prints it (the
// YAML on stdout, the new rules on stderr) and approves it (applied to the sandbox,
// or with --write written into the server's library as NAME and the sandbox put under
// it) or rejects it, quoting its digest: a proposal that changed meanwhile is refused
// by the server (412), and decided again only by running the command again.
func decideProposal(cmd *cobra.Command, f *sandboxFlags, sandbox string, d proposalDecision) error {
	for _, name := range localFlags {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s shapes a proposal computed here: --approve, --reject and --write decide the server's pending proposal as it stands", name)
		}
	}
	switch {
	case d.approve && d.reject:
		return errors.New("--approve and --reject exclude each other")
	case d.reject && d.write != "":
		return errors.New("--write approves: it does not go with --reject")
	case d.replace && d.write == "":
		return errors.New("--replace needs --write NAME")
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	p, err := c.PolicyProposal(cmd.Context(), sandbox)
	if err != nil {
		return err
	}
	if !p.Pending {
		return fmt.Errorf("nothing pending for sandbox %s: its policy allows everything it did since the last decision", sandbox)
	}
	if _, err := fmt.Fprint(cmd.OutOrStdout(), p.YAML); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(cmd.ErrOrStderr(), 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tTARGET\tSCOPE\tSEEN\tREFUSED")
	for _, r := range p.Rules {
		if r.New {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", r.Rule, r.Target, r.Scope, r.Seen, r.Refused)
		}
	}
	tw.Flush()
	req := sdk.ProposalDecision{Decision: "approve", Digest: p.Digest, SaveAs: d.write, Replace: d.replace}
	if d.reject {
		req.Decision = "reject"
	}
	info, err := c.DecideProposal(cmd.Context(), sandbox, req)
	if err != nil {
		return err
	}
	w := cmd.ErrOrStderr()
	switch {
	case d.reject:
		fmt.Fprintf(w, "rejected the proposal %s of sandbox %s\n", short(p.Digest), sandbox)
	case d.write != "":
		fmt.Fprintf(w, "approved: written into the server's library as %s; sandbox %s runs under it (policy version %d)\n", d.write, sandbox, info.Version)
	default:
		fmt.Fprintf(w, "approved: applied to sandbox %s (policy version %d)\n", sandbox, info.Version)
	}
	return nil
}

// short is the first 12 characters of a digest.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
