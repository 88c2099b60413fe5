package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
)

// defaultAuditDir is where egressd writes the audit log unless configured otherwise.
const defaultAuditDir = "/var/lib/airlock/audit"

func newAuditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Verify and read the tamper-evident audit log"}
	cmd.AddCommand(newAuditVerifyCmd(), newAuditTailCmd(), newAuditQueryCmd(), newAuditKeygenCmd())
	return cmd
}

func newAuditVerifyCmd() *cobra.Command {
	var (
		pubPath string
		asJSON  bool
		anchors string
	)
	c := &cobra.Command{
		Use:   "verify DIR",
		Short: "Prove the hash chain of an audit log directory",
		Long: `Checks every record's SHA-256 chain link, consecutive seqs across rotated files, and the
rotation checkpoints: their own chain, each file's SHA-256 and their Ed25519 signatures,
and the signed head (DIR/head.json: the last seq and hash the writer had fsync'd, and
its last checkpoint): a log that ends before the head's seq, or lacks the head's
checkpoint, was cut off ("truncated", a break), although what remains chains. Reports
the first broken record by file, line and seq and exits non-zero. An incomplete last
line (a crash mid-write) is reported, not a break. The head's age is printed: a head
put back from earlier, with the log cut to match, verifies; only checkpoints and heads
kept off the host show that.

Signatures are checked with --public-key, else with DIR.pub beside the directory when it
exists (the public key 'airlock up', 'airlock egressd' and 'airlock gateway' write next
to the signing key DIR.key they generate at first start). With DIR.pub, checkpoints
written before the log had a key may be unsigned (a warning); with --public-key every
checkpoint must be signed.

With --anchors DIR (the directory of an anchor sink, airlock.yaml audit.anchors.dir:
signed digests of every checkpoint and head, shipped off the host as they were written,
each naming the previous one), the log is also checked against them, and the verdict
says which: "rewritten" (a checkpoint or record differs from its anchor: the chain was
rewritten with recomputed hashes; names the first rewritten checkpoint), "truncated"
(the anchors name records past the log's end, even with an older head put back), or
ok, with the anchors of files retention removed reported as retained (expected).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, keyFile, err := verifyOptions(args[0], pubPath)
			if err != nil {
				return err
			}
			if anchors != "" {
				return verifyWithAnchors(cmd, args[0], anchors, opts, asJSON)
			}
			rep, err := audit.Verify(args[0], opts)
			if rep == nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if eerr := enc.Encode(rep); eerr != nil {
					return eerr
				}
				return err
			}
			fmt.Fprintf(out, "files:       %d\nrecords:     %d (seq %d..%d)\ncheckpoints: %d\nlost:        %d (records the writer had to drop, as recorded in loss records)\n",
				rep.Files, rep.Records, rep.FirstSeq, rep.LastSeq, rep.Checkpoints, rep.Lost)
			if rep.LastHash != "" {
				fmt.Fprintf(out, "last hash:   %s\n", rep.LastHash)
			}
			switch {
			case rep.UnverifiedSignatures > 0:
				fmt.Fprintf(out, "signatures:  %d not checked (pass --public-key)\n", rep.UnverifiedSignatures)
			case keyFile != "":
				fmt.Fprintf(out, "signatures:  %d verified with %s\n", rep.VerifiedSignatures, keyFile)
			}
			if h := rep.Head; h != nil {
				signed := "unsigned"
				if h.Signed {
					signed = "signed"
				}
				fmt.Fprintf(out, "head:        seq %d, %s, written %s (%s ago; an older head put back with a log cut to match is only caught by an anchor off the host)\n",
					h.Seq, signed, h.Time.Format(time.RFC3339), time.Duration(h.AgeSeconds*float64(time.Second)).Round(time.Second))
			}
			if rep.AnchoredBy != "" {
				fmt.Fprintf(out, "retained:    %d files retained away (expected; the log starts at seq %d, anchored by the checkpoint of %s)\n", rep.RetainedFiles, rep.FirstSeq, rep.AnchoredBy)
			}
			if rep.TornTail != nil {
				fmt.Fprintf(out, "torn tail:   %s line %d is incomplete (crash while writing); not part of the chain\n", rep.TornTail.File, rep.TornTail.Line)
			}
			for _, w := range rep.Warnings {
				fmt.Fprintf(out, "warning:     %s\n", w)
			}
			if b := rep.Broken; b != nil {
				fmt.Fprintf(out, "BROKEN:      %s line %d (seq %d): %s\n", b.File, b.Line, b.Seq, b.Reason)
				return errors.New("audit chain broken")
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(out, "chain:       ok")
			return nil
		},
	}
	c.Flags().StringVar(&pubPath, "public-key", "", "Ed25519 public key file to check checkpoint signatures (default DIR.pub when it exists)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	c.Flags().StringVar(&anchors, "anchors", "", "anchor sink directory (audit.anchors.dir) to check the log against")
	return c
}

// verifyOptions are the options of verify for dir: the public key of --public-key
// (every checkpoint must be signed), else the one beside dir when it exists (earlier
// unsigned checkpoints allowed), else none. keyFile is the key file used.
func verifyOptions(dir, pubPath string) (opts audit.VerifyOptions, keyFile string, err error) {
	if pubPath == "" {
		_, def := audit.DefaultKeyFiles(dir)
		if _, err := os.Stat(def); err != nil {
			return opts, "", nil
		}
		pubPath, opts.UnsignedBefore = def, true
	}
	if opts.PublicKey, err = audit.LoadPublicKey(pubPath); err != nil {
		return opts, "", err
	}
	return opts, pubPath, nil
}

func newAuditTailCmd() *cobra.Command {
	var (
		dir     string
		sandbox string
		n       int
		follow  bool
		since   string
		until   string
	)
	c := &cobra.Command{
		Use:   "tail",
		Short: "Print the last audit records (JSON Lines), optionally following new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := audit.Filter{SandboxID: sandbox}
			var err error
			if since != "" {
				if f.Since, err = time.Parse(time.RFC3339, since); err != nil {
					return fmt.Errorf("--since: %w", err)
				}
			}
			if until != "" {
				if f.Until, err = time.Parse(time.RFC3339, until); err != nil {
					return fmt.Errorf("--until: %w", err)
				}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetEscapeHTML(false)
			recs, err := audit.Tail(dir, n, f)
			if err != nil {
				return err
			}
			for _, r := range recs {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
			if !follow {
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if len(recs) > 0 {
				f.AfterSeq = recs[len(recs)-1].Seq
			}
			f.Since, f.Until = time.Time{}, time.Time{}
			return audit.Follow(ctx, dir, f, 0, func(r audit.Record) error { return enc.Encode(r) })
		},
	}
	c.Flags().StringVar(&dir, "dir", defaultAuditDir, "audit log directory")
	c.Flags().StringVar(&sandbox, "sandbox", "", "only records of this sandbox id")
	c.Flags().IntVarP(&n, "lines", "n", 20, "how many records to print before following")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing records as they are written")
	c.Flags().StringVar(&since, "since", "", "only records at or after this RFC 3339 time")
	c.Flags().StringVar(&until, "until", "", "only records before this RFC 3339 time")
	return c
}

func newAuditKeygenCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "keygen PREFIX",
		Short: "Write an Ed25519 key pair for signing checkpoints (PREFIX.key, PREFIX.pub)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			priv, pub := args[0]+".key", args[0]+".pub"
			if _, err := os.Stat(priv); err == nil {
				return fmt.Errorf("%s exists; not overwriting a signing key", priv)
			}
			if err := audit.GenerateKeyFiles(priv, pub); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "signing key %s (keep it on the egressd host), public key %s (for verify)\n", priv, pub)
			return nil
		},
	}
	return c
}
