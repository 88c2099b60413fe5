package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/sdk"
)

// sandboxFlags are shared by every `airlock sandbox` subcommand.
type sandboxFlags struct {
	server string
	apiKey string
	json   bool
}

func (f *sandboxFlags) client() (*sdk.Client, error) {
	key := f.apiKey
	if key == "" {
		key = os.Getenv("OPEN_SANDBOX_API_KEY")
	}
	if key == "" {
		// The key `airlock up` generated, when this user can read it.
		if b, err := os.ReadFile("/var/lib/airlock/api-key"); err == nil {
			key = strings.TrimSpace(string(b))
		}
	}
	server := f.server
	if server == "" {
		server = os.Getenv("AIRLOCK_SERVER")
	}
	return sdk.New(sdk.Config{BaseURL: server, APIKey: key})
}

func newSandboxCmd() *cobra.Command {
	f := &sandboxFlags{}
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, list, inspect, run commands in and remove sandboxes",
		Long: `Manage sandboxes through the lifecycle API (any OpenSandbox-compatible server).
The server is --server, else $AIRLOCK_SERVER, else ` + sdk.DefaultBaseURL + `; the key is
--api-key, else $OPEN_SANDBOX_API_KEY, else /var/lib/airlock/api-key when readable.`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "lifecycle API URL (default $AIRLOCK_SERVER or "+sdk.DefaultBaseURL+")")
	pf.StringVar(&f.apiKey, "api-key", "", "API key (default $OPEN_SANDBOX_API_KEY or the key airlock up stored)")
	pf.BoolVar(&f.json, "json", false, "print JSON instead of a table")
	cmd.AddCommand(sbCreate(f), sbList(f), sbGet(f), sbExec(f), sbRemove(f), sbPause(f, true), sbPause(f, false), sbRenew(f), sbRevokeURLs(f), sbVault(f), sbPolicy(f),
		sbDiagnostics(f, opensandbox.DiagnosticLogs), sbDiagnostics(f, opensandbox.DiagnosticEvents))
	return cmd
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printSandboxes(w io.Writer, asJSON bool, sbs []sdk.Sandbox) error {
	if asJSON {
		return printJSON(w, sbs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tCREATED\tEXPIRES\tMETADATA")
	for _, sb := range sbs {
		img := ""
		if sb.Image != nil {
			img = sb.Image.URI
		}
		exp := "never"
		if sb.ExpiresAt != nil {
			exp = sb.ExpiresAt.Local().Format(time.DateTime)
		}
		var md []string
		for k, v := range sb.Metadata {
			md = append(md, k+"="+v)
		}
		sort.Strings(md)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Status.State, img,
			sb.CreatedAt.Local().Format(time.DateTime), exp, strings.Join(md, ","))
	}
	return tw.Flush()
}

func parsePairs(pairs []string, what string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", what, p)
		}
		m[k] = v
	}
	return m, nil
}

func sbCreate(f *sandboxFlags) *cobra.Command {
	var (
		image, cpu, memory string
		policyFile         string
		timeout            time.Duration
		env, metadata      []string
		noWait, credProxy  bool
	)
	cmd := &cobra.Command{
		Use:   "create [flags] [-- entrypoint...]",
		Short: "Create a sandbox and wait until it is running",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			envs, err := parsePairs(env, "--env")
			if err != nil {
				return err
			}
			md, err := parsePairs(metadata, "--metadata")
			if err != nil {
				return err
			}
			var doc json.RawMessage
			var ext map[string]string
			if policyFile != "" {
				if _, statErr := os.Stat(policyFile); statErr != nil && !strings.ContainsAny(policyFile, "/.") {
					ext = map[string]string{"airlock.dev/policy": policyFile} // a named policy of the server
				} else if doc, err = loadPolicyFile(policyFile); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			sb, err := c.Create(ctx, sdk.CreateRequest{
				Image: image, Entrypoint: args, Timeout: timeout, Env: envs, Metadata: md,
				Resources:       map[string]string{"cpu": cpu, "memory": memory},
				CredentialProxy: credProxy, NetworkPolicy: doc, Extensions: ext,
			})
			if err != nil {
				return err
			}
			if !noWait {
				wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				if sb, err = c.WaitState(wctx, sb.ID, opensandbox.Running, 100*time.Millisecond); err != nil {
					return err
				}
			}
			return printSandboxes(cmd.OutOrStdout(), f.json, []sdk.Sandbox{*sb})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&image, "image", "airlock/sandbox:latest", "image")
	fl.StringVar(&cpu, "cpu", "1", "CPU limit (500m, 2)")
	fl.StringVar(&memory, "memory", "2Gi", "memory limit (512Mi, 2Gi)")
	fl.DurationVar(&timeout, "timeout", 10*time.Minute, "time to live; 0 for manual cleanup")
	fl.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&metadata, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	fl.BoolVar(&noWait, "no-wait", false, "answer at once (state Pending)")
	fl.StringVar(&policyFile, "policy", "", "egress policy: a file (YAML or JSON, Airlock or OpenSandbox networkPolicy form, checked here first) or the name of a server's named policy (airlock policy list)")
	fl.BoolVar(&credProxy, "credential-proxy", false, "enable the Credential Vault: egressd injects bound credentials into the sandbox's HTTP(S) (see sandbox vault)")
	return cmd
}

func sbList(f *sandboxFlags) *cobra.Command {
	var (
		states, metadata []string
		page, pageSize   int
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			md, err := parsePairs(metadata, "--metadata")
			if err != nil {
				return err
			}
			p, err := c.List(cmd.Context(), sdk.ListOptions{States: states, Metadata: md, Page: page, PageSize: pageSize})
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			return printSandboxes(cmd.OutOrStdout(), false, p.Items)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&states, "state", nil, "only this state (repeatable, OR)")
	fl.StringArrayVarP(&metadata, "metadata", "m", nil, "only with metadata KEY=VALUE (repeatable, AND)")
	fl.IntVar(&page, "page", 1, "page number")
	fl.IntVar(&pageSize, "page-size", 100, "sandboxes per page")
	return cmd
}

func sbGet(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printSandboxes(cmd.OutOrStdout(), f.json, []sdk.Sandbox{*sb})
		},
	}
}

func sbExec(f *sandboxFlags) *cobra.Command {
	var cwd string
	return &cobra.Command{
		Use:   "exec ID -- COMMAND...",
		Short: "Run a shell command in a sandbox, streaming its output; exits with its code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			x, err := c.Execd(ctx, args[0])
			if err != nil {
				return err
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			var events []sdk.Event
			ex, err := x.Run(ctx, sdk.Command{Command: strings.Join(args[1:], " "), Cwd: cwd}, func(ev sdk.Event) error {
				if f.json {
					events = append(events, ev)
					return nil
				}
				switch ev.Type {
				case "stdout":
					fmt.Fprintln(out, ev.Text)
				case "stderr":
					fmt.Fprintln(errOut, ev.Text)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if f.json {
				if err := printJSON(out, events); err != nil {
					return err
				}
			}
			if code := ex.ExitCode(); code != 0 {
				// The command's own exit code is the CLI's, like ssh and docker exec.
				os.Exit(code)
			}
			return nil
		},
	}
}

func sbRemove(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"kill", "delete"},
		Short:   "Remove sandboxes (also paused ones)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return errors.Join(errs...)
		},
	}
}

func sbPause(f *sandboxFlags, pause bool) *cobra.Command {
	use, short := "pause ID", "Freeze a running sandbox"
	if !pause {
		use, short = "resume ID", "Thaw a paused sandbox"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			op := c.Resume
			if pause {
				op = c.Pause
			}
			if err := op(cmd.Context(), args[0]); err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printSandboxes(cmd.OutOrStdout(), f.json, []sdk.Sandbox{*sb})
		},
	}
}

func sbRevokeURLs(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke-urls ID",
		Short: "Make every signed URL minted so far for a sandbox stop working",
		Long: `Revoke the sandbox's signed URLs: the gateway refuses (401) every signed URL minted
before, within its watch latency; signed URLs minted afterwards work.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			epoch, err := c.RevokeSignedURLs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"id": args[0], "signedUrlEpoch": epoch})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s signed URLs revoked (epoch %d)\n", args[0], epoch)
			return nil
		},
	}
}

func sbRenew(f *sandboxFlags) *cobra.Command {
	var d time.Duration
	cmd := &cobra.Command{
		Use:   "renew ID",
		Short: "Move a sandbox's expiry to now + --for",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			at, err := c.Renew(cmd.Context(), args[0], time.Now().Add(d))
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]time.Time{"expiresAt": at})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s expires at %s\n", args[0], at.Local().Format(time.DateTime))
			return nil
		},
	}
	cmd.Flags().DurationVar(&d, "for", 10*time.Minute, "new time to live from now")
	return cmd
}

func sbVault(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "vault ID",
		Short: "Show a sandbox's Credential Vault: credentials and bindings, never their values",
		Long: `Shows the sanitized Credential Vault of a sandbox created with credentialProxy.enabled
(OpenSandbox egress API /credential-vault): its revision, each credential's name and
source type, each binding's match and auth type. Secret values are write-only and never
shown. --json prints the API's CredentialVaultState.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			v, err := c.Vault(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			st, err := v.Get(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.json {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			fmt.Fprintf(out, "revision %d\n\n", st.Revision)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "CREDENTIAL\tSOURCE\tREVISION")
			for _, c := range st.Credentials {
				fmt.Fprintf(tw, "%s\t%s\t%d\n", c.Name, c.SourceType, c.Revision)
			}
			tw.Flush()
			fmt.Fprintln(out)
			fmt.Fprintln(tw, "BINDING\tAUTH\tHOSTS\tSCHEMES\tPORTS\tMETHODS\tPATHS\tREVISION")
			for _, b := range st.Bindings {
				auth := b.Auth.Type
				if b.Auth.Name != "" {
					auth += " " + b.Auth.Name
				}
				m := b.Match
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\t%d\n", b.Name, auth, strings.Join(m.Hosts, ","),
					strings.Join(m.Schemes, ","), m.Ports, strings.Join(m.Methods, ","), strings.Join(m.Paths, ","), b.Revision)
			}
			return tw.Flush()
		},
	}
}

func sbPolicy(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "policy ID [FILE]",
		Short: "Show a sandbox's egress policy, or replace it with FILE",
		Long: `Without FILE, prints the sandbox's policy version and document. With FILE (YAML or
JSON, Airlock or OpenSandbox networkPolicy form), checks it here exactly as the server does
(an invalid file is reported with its line and changes nothing), replaces the sandbox's
policy and prints the new version; against airlock up the answer comes once the new policy
is enforced.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var p *sdk.PolicyInfo
			if len(args) == 2 {
				doc, err := loadPolicyFile(args[1])
				if err != nil {
					return err
				}
				p, err = c.SetPolicy(cmd.Context(), args[0], doc)
			} else {
				p, err = c.Policy(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			var doc any
			_ = json.Unmarshal(p.Policy, &doc)
			b, _ := json.MarshalIndent(doc, "", "  ")
			named := ""
			if p.Name != "" {
				named = " (named policy " + p.Name + " with the sandbox's additions first)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s policy version %d%s\n%s\n", p.SandboxID, p.Version, named, b)
			return nil
		},
	}
}

// loadPolicyFile reads and checks a policy file as lifecycle would (errors carry the
// file, line and reason) and returns it in Airlock's JSON form.
func loadPolicyFile(path string) (json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := policies.Parse(path, data)
	if err != nil {
		return nil, err
	}
	return json.Marshal(p)
}
