package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/airlockdev/airlock/policies"
)

// printFloor prints the platform floor (policies.Overlay.Floor): the overlay's
// always-deny entries, then the special-address classes.
func printFloor(out io.Writer, floor []policies.FloorEntry) {
	fmt.Fprintln(out, "platform floor: denied whatever a policy says (checked before the policy, in report mode too):")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	guard := false
	for _, e := range floor {
		if e.Overridable && !guard {
			tw.Flush()
			fmt.Fprintln(out, "special addresses: reached only through an explicit IP/CIDR allow rule (never a name's answer, a catch-all or the default):")
			guard = true
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Rule, e.Target, e.Source, e.Note)
	}
	tw.Flush()
}

// explainFloor says when dec is the floor's, not a rule's: an always-deny entry of the
// overlay (no policy rule can allow it) or the special-address guard.
func explainFloor(out io.Writer, dec policies.Decision, floor []policies.FloorEntry) {
	switch {
	case dec.InFloor():
		for _, e := range floor {
			if e.Rule == dec.Rule {
				fmt.Fprintf(out, "floor:    the platform floor denies this (%s, %s: %s), not a rule of the policy; no policy rule can allow it\n", e.Target, e.Source, e.Note)
				return
			}
		}
		fmt.Fprintln(out, "floor:    the platform floor denies this, not a rule of the policy; no policy rule can allow it")
	case dec.Rule == "guard":
		fmt.Fprintln(out, "floor:    a special address: the floor denies it unless an explicit IP/CIDR allow rule of the policy names it")
	}
}
