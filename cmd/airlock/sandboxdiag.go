package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// sbDiagnostics is `airlock sandbox logs ID` (kind logs) and `airlock sandbox events
// ID` (kind events): the diagnostics API (docs/spec/diagnostic-api.yml). It prints the
// text (downloading it when the server delivers it by URL) and the server's warnings
// on stderr; --json prints the descriptor instead.
func sbDiagnostics(f *sandboxFlags, kind string) *cobra.Command {
	var scope string
	var byURL bool
	cmd := &cobra.Command{
		Use:   kind + " ID",
		Args:  cobra.ExactArgs(1),
		Short: "Print a sandbox's container logs (stdout and stderr, timestamped)",
		Long: `Print a sandbox's container output (stdout and stderr as the runtime recorded them,
every line timestamped), also after the sandbox failed or its entrypoint exited.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			o := sdk.DiagnosticOptions{Scope: scope}
			if byURL {
				o.Delivery = opensandbox.DeliveryURL
			}
			d, err := c.Diagnostics(cmd.Context(), args[0], kind, o)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			text, err := c.DiagnosticText(cmd.Context(), d)
			if err != nil {
				return err
			}
			printDiagnostic(cmd.OutOrStdout(), cmd.ErrOrStderr(), d, text)
			return nil
		},
	}
	def := "container"
	if kind == opensandbox.DiagnosticEvents {
		def = "all"
		cmd.Short = "Print a sandbox's events: lifecycle, network (policy versions, egress) and runtime"
		cmd.Long = `Print a sandbox's events, oldest first: what Airlock did (create, state
transitions, release of the entrypoint), its egress (policy versions stored and
enforced, the datapath attached before the entrypoint ran) and what the runtime
reports (image pull, container start, OOM kills, the exit code; Kubernetes Events).
--scope lifecycle|network|runtime|all.`
	}
	cmd.Flags().StringVar(&scope, "scope", def, "diagnostic scope")
	cmd.Flags().BoolVar(&byURL, "url", false, "ask for URL delivery (the text is downloaded from it)")
	return cmd
}

// printDiagnostic writes text to out (with a final newline) and d's truncation and
// warnings to errOut.
func printDiagnostic(out, errOut io.Writer, d *opensandbox.DiagnosticContent, text string) {
	fmt.Fprint(out, text)
	if text != "" && text[len(text)-1] != '\n' {
		fmt.Fprintln(out)
	}
	if d.Truncated {
		fmt.Fprintln(errOut, "airlock: the server truncated this text to its size limit (the newest part is shown)")
	}
	for _, w := range d.Warnings {
		fmt.Fprintln(errOut, "airlock: warning:", w)
	}
}
