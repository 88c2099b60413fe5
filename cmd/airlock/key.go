package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/principal"
	"github.com/airlockdev/airlock/sdk"
)

func newKeyCmd() *cobra.Command {
	f := &sandboxFlags{}
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Create, list, revoke and rotate API keys (principals with a role)",
		Long: `Every API key is a principal: an id, a name and a role.
  admin     everything, including key management
  operator  sandboxes and policies (every sandbox), no key management
  auditor   read-only: sandboxes, policies, audit records, diagnostics
  user      creates sandboxes and uses its own only (others are 404 to it)
Keys are stored hashed and shown once, by create and rotate; revoke and rotate take
effect at once, without a restart. The key airlock up prints is the first admin.
The server is --server, else $AIRLOCK_SERVER, else ` + sdk.DefaultBaseURL + `; the key is
--api-key, else $OPEN_SANDBOX_API_KEY, else /var/lib/airlock/api-key when readable.`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "lifecycle API URL (default $AIRLOCK_SERVER or "+sdk.DefaultBaseURL+")")
	pf.StringVar(&f.apiKey, "api-key", "", "API key (default $OPEN_SANDBOX_API_KEY or the key airlock up stored)")
	pf.BoolVar(&f.json, "json", false, "print JSON instead of text")
	cmd.AddCommand(keyCreate(f), keyList(f), keyRevoke(f), keyRotate(f), keyWhoami(f))
	return cmd
}

// printCreated prints a new or rotated key: the key alone on its last line, so that
// `airlock key create ... | tail -1` captures it.
func printCreated(cmd *cobra.Command, f *sandboxFlags, c *principal.Created, verb string) error {
	if f.json {
		return printJSON(cmd.OutOrStdout(), c)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "%s key of %s (%s, role %s); it is shown only now:\n%s\n", verb, c.ID, c.Name, c.Role, c.Key)
	return nil
}

func keyCreate(f *sandboxFlags) *cobra.Command {
	var name, role string
	cmd := &cobra.Command{
		Use:   "create --name NAME --role admin|operator|auditor|user",
		Short: "Create a principal and print its key (once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := principal.ParseRole(role)
			if err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), name, r)
			if err != nil {
				return err
			}
			return printCreated(cmd, f, k, "created")
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "who or what the key is for (required)")
	cmd.Flags().StringVar(&role, "role", "user", "admin, operator, auditor or user")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func keyList(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the principals (never their keys)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			keys, err := c.Keys(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), keys)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tROLE\tCREATED\tROTATED")
			for _, k := range keys {
				created, rotated := "configured", "-"
				if !k.Configured {
					created = k.CreatedAt.Local().Format(time.DateTime)
				}
				if !k.RotatedAt.IsZero() {
					rotated = k.RotatedAt.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Role, created, rotated)
			}
			return tw.Flush()
		},
	}
}

func keyRevoke(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke keys: they stop working at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.RevokeKey(cmd.Context(), id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), id, "revoked")
			}
			return nil
		},
	}
}

func keyRotate(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate ID",
		Short: "Give a principal a new key (printed once); the old one stops working at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			k, err := c.RotateKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printCreated(cmd, f, k, "rotated")
		},
	}
}

func keyWhoami(f *sandboxFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Print the principal of the key in use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			p, err := c.Self(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s (%s), role %s\n", p.ID, p.Name, p.Role)
			return nil
		},
	}
}
