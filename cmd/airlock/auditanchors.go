package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
)

// verifyWithAnchors is `airlock audit verify DIR --anchors SINK`: the log checked
// against the anchors a DirSink holds (audit.VerifyAnchors), the verdict printed.
func verifyWithAnchors(cmd *cobra.Command, dir, sink string, opts audit.VerifyOptions, asJSON bool) error {
	as, err := audit.ReadAnchors(sink)
	if err != nil {
		return err
	}
	if len(as) == 0 {
		return fmt.Errorf("%s holds no anchors (%s)", sink, audit.AnchorFile)
	}
	ar, err := audit.VerifyAnchors(dir, as, opts)
	if ar == nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if eerr := enc.Encode(ar); eerr != nil {
			return eerr
		}
		return err
	}
	if r := ar.Log; r != nil {
		fmt.Fprintf(out, "log:         %d files, %d records (seq %d..%d), %d checkpoints\n", r.Files, r.Records, r.FirstSeq, r.LastSeq, r.Checkpoints)
		if r.AnchoredBy != "" {
			fmt.Fprintf(out, "retained:    %d files retained away (expected; the log starts at seq %d)\n", r.RetainedFiles, r.FirstSeq)
		}
	}
	fmt.Fprintf(out, "anchors:     %d in %s, last names seq %d (%s); %d checked, %d of retained records (expected)\n",
		ar.Anchors, sink, ar.LastSeq, ar.LastTime.Format("2006-01-02T15:04:05Z07:00"), ar.Checked, ar.Retained)
	if b := ar.Broken; b != nil {
		fmt.Fprintf(out, "%s: %s line %d (seq %d): %s\n", ar.Finding, b.File, b.Line, b.Seq, b.Reason)
		return errors.New("audit log does not match its anchors: " + ar.Finding)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "verdict:     ok (the log matches its anchors)")
	return nil
}
