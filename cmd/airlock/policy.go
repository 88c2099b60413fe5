package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/egressd"
	"github.com/airlockdev/airlock/policies"
)

func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Check, compare, test and apply egress policies; the server's named policies"}
	cmd.AddCommand(newPolicyValidateCmd(), newPolicyExplainCmd())
	addPolicyServerCmds(cmd)
	return cmd
}

func newPolicyValidateCmd() *cobra.Command {
	var overlay bool
	c := &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check policy files (YAML or JSON, Airlock or OpenSandbox networkPolicy form)",
		Long: `Parses each file strictly, exactly as lifecycle and egressd do: unknown keys, bad CIDRs,
misplaced wildcards and conflicting rules are errors reported with file, line and column.
Operator overlays (alwaysDeny/alwaysAllow) are recognised by their keys, or forced with
--overlay. A directory stands for the .yaml, .yml and .json files in it (not recursive).
Exits non-zero when any file is invalid.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			var files []string
			for _, arg := range args {
				st, err := os.Stat(arg)
				if err != nil || !st.IsDir() {
					files = append(files, arg)
					continue
				}
				for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
					m, _ := filepath.Glob(filepath.Join(arg, pat))
					files = append(files, m...)
				}
			}
			bad := 0
			for _, path := range files {
				if err := validateOne(out, path, overlay); err != nil {
					bad++
					fmt.Fprintln(out, err)
				}
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d files invalid", bad, len(files))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&overlay, "overlay", false, "treat every file as an operator overlay")
	return c
}

func validateOne(out io.Writer, path string, overlay bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if overlay || policies.IsOverlayDocument(data) {
		o, err := policies.ParseOverlay(path, data)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: ok: overlay, %d always-deny, %d always-allow\n", path, len(o.AlwaysDeny), len(o.AlwaysAllow))
		return nil
	}
	p, err := policies.Parse(path, data)
	if err != nil {
		return err
	}
	if _, err := policies.Compile(p, policies.CompileOptions{Overlay: policies.BaseOverlay()}); err != nil {
		return err
	}
	hosts := 0
	for _, r := range p.Egress {
		if r.HTTP != nil {
			hosts++
		}
	}
	extra := ""
	if hosts > 0 {
		extra = fmt.Sprintf(", http rules on %d hosts", hosts)
	}
	if n := ownModeRules(p); n > 0 {
		extra += fmt.Sprintf(", %d rules in %s", n, otherMode(p.EffectiveMode()))
	}
	fmt.Fprintf(out, "%s: ok: %d rules, default %s, mode %s, l7 %s, audit %s%s\n", path, len(p.Egress),
		p.EffectiveDefault(), p.EffectiveMode(), p.EffectiveL7(), p.EffectiveAudit(), extra)
	return nil
}

func newPolicyExplainCmd() *cobra.Command {
	var (
		port      uint16
		proto     string
		overlays  []string
		noBuiltin bool
		dump      bool
		headers   []string
		showFloor bool
	)
	c := &cobra.Command{
		Use:   "explain FILE NAME|IP | explain FILE METHOD URL | explain --floor [FILE ...]",
		Short: "Show which rule decides a destination (or an HTTP request) and why",
		Long: `Compiles FILE with the built-in operator overlay (cloud metadata, link-local, loopback,
localhost; --no-builtin drops it) plus any --overlay files, and decides NAME or IP at
--port/--proto (default: any port, the question DNS asks). Lists every rule whose target
matches, in evaluation order, marking the one that decides. --dump prints the compiled
policy's indexes.

With a METHOD and an http:// or https:// URL, decides the URL's host at its port (80 or
443 by default) over TCP, then the request against the host's HTTP rules (headers from
--header "Name: value"), listing every HTTP rule of the host with whether it matches.

The platform floor is what no policy rule can allow: the built-in always-deny list, this
machine's own addresses (egressd denies its host's), the --overlay files' always-deny
entries, and the special-address classes that only an explicit IP/CIDR rule reaches.
--floor lists it (alone, or before an explain); a destination the floor denies is
explained as the floor, not as a rule of FILE.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if showFloor && (len(args) == 0 || len(args) == 1) {
				return nil
			}
			return cobra.RangeArgs(2, 3)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ov := &policies.Overlay{}
			if !noBuiltin {
				ov = policies.BaseOverlay()
				ov.DenyAddrs(egressd.HostAddrs()...)
			}
			for _, path := range overlays {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				o, err := policies.ParseOverlay(path, b)
				if err != nil {
					return err
				}
				ov = ov.Merge(o)
			}
			out := cmd.OutOrStdout()
			floor := ov.Floor()
			if showFloor {
				printFloor(out, floor)
				if len(args) < 2 {
					return nil
				}
				fmt.Fprintln(out)
			}
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			d, err := policies.Load(filepath.Base(args[0]), data, policies.CompileOptions{Overlay: ov})
			if err != nil {
				return err
			}
			var p policies.Protocol
			switch proto {
			case "", "any":
			case "tcp", "udp":
				p = policies.Protocol(proto)
			default:
				return fmt.Errorf("--proto %q: want tcp, udp or any", proto)
			}
			if dump {
				d.Dump(out)
				fmt.Fprintln(out)
			}
			if len(args) == 3 {
				return explainHTTP(out, d, floor, args[1], args[2], headers)
			}
			explain(out, d, floor, args[1], port, p)
			return nil
		},
	}
	c.Flags().StringArrayVarP(&headers, "header", "H", nil, `request header "Name: value" for METHOD URL (repeatable)`)
	c.Flags().Uint16Var(&port, "port", 0, "destination port (0: any)")
	c.Flags().StringVar(&proto, "proto", "", "tcp, udp or any")
	c.Flags().StringSliceVar(&overlays, "overlay", nil, "operator overlay file (repeatable)")
	c.Flags().BoolVar(&noBuiltin, "no-builtin", false, "leave out the built-in always-deny list")
	c.Flags().BoolVar(&dump, "dump", false, "print the compiled policy first")
	c.Flags().BoolVar(&showFloor, "floor", false, "list the platform floor (what no policy rule can allow)")
	return c
}

func explain(out io.Writer, d *policies.Decider, floor []policies.FloorEntry, target string, port uint16, proto policies.Protocol) {
	dec, matches := d.Explain(target, port, proto)
	at := "any port"
	if port != 0 {
		at = fmt.Sprintf("port %d", port)
	}
	if proto != "" {
		at += "/" + string(proto)
	}
	kind := "name"
	if a, err := netip.ParseAddr(strings.TrimSpace(target)); err == nil {
		kind = "address, class " + string(policies.Classify(a.WithZone("")))
	}
	verdict := string(dec.Action)
	if dec.WouldDeny {
		verdict += " (audit mode: would_deny, enforce would deny)"
	}
	fmt.Fprintf(out, "target:   %s (%s) at %s\n", target, kind, at)
	fmt.Fprintf(out, "decision: %s\n", verdict)
	fmt.Fprintf(out, "mode:     %s\n", modeLine(d, dec.Rule))
	fmt.Fprintf(out, "rule:     %s\n", dec.Rule)
	fmt.Fprintf(out, "reason:   %s\n", dec.Reason)
	explainFloor(out, dec, floor)
	if port == 0 && proto == "" && kind == "name" && dec.Action == policies.Allow {
		fmt.Fprintf(out, "reach:    %s\n", dec.Ports)
		fmt.Fprintf(out, "dns:      query types %s; answers are classified, private/link-local/loopback addresses dropped unless an IP rule allows them\n",
			strings.Join(d.DNS().QueryTypes, ","))
	}
	if len(matches) == 0 {
		fmt.Fprintln(out, "matching: no rule matches; the default applies")
		return
	}
	fmt.Fprintln(out, "matching rules in evaluation order:")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	decided := false
	for _, m := range matches {
		mark, note := " ", ""
		switch {
		case m.Rule == dec.Rule && !decided:
			mark, note, decided = "*", "decides", true
		case !m.Covers:
			note = "other ports/protocols"
		case decided:
			note = "shadowed"
		}
		loc := ""
		if m.Line > 0 {
			loc = fmt.Sprintf("%s:%d", m.Source, m.Line)
		}
		if m.Comment != "" {
			note = strings.TrimSpace(note + " (" + m.Comment + ")")
		}
		fmt.Fprintf(tw, "  %s %s\t%s\t%s\t%s\t%s\t%s\n", mark, m.Rule, m.Action, m.Target, m.Scope, loc, note)
	}
	tw.Flush()
	if !decided && dec.Rule == "guard" {
		fmt.Fprintln(out, "  (no explicit IP/CIDR rule allows this special address)")
	}
}

// ownModeRules counts the rules (and HTTP rules) of p whose own mode differs from the
// policy's.
func ownModeRules(p *policies.Policy) int {
	n := 0
	for i := range p.Egress {
		r := &p.Egress[i]
		if p.RuleMode(r) != p.EffectiveMode() {
			n++
		}
		if r.HTTP != nil {
			for _, h := range r.HTTP.Rules {
				if h.Mode != "" && h.Mode != p.RuleMode(r) {
					n++
				}
			}
		}
	}
	return n
}

func otherMode(m policies.Mode) policies.Mode {
	if m == policies.AuditMode {
		return policies.Enforce
	}
	return policies.AuditMode
}

// modeLine says the policy's mode and, when the deciding rule (ref "egress[i]" or
// "egress[i].http…") has another, that one; the overlay and the guard are always
// enforced.
func modeLine(d *policies.Decider, ref string) string {
	line := fmt.Sprintf("policy %s", d.Mode())
	switch {
	case strings.HasPrefix(ref, "overlay.") || ref == "guard":
		return line + "; the platform floor (" + ref + ") is enforced in every mode"
	case strings.HasPrefix(ref, "egress["):
		var i int
		if _, err := fmt.Sscanf(ref, "egress[%d]", &i); err != nil {
			return line
		}
		p := d.Policy()
		if i < len(p.Egress) && p.Egress[i].Mode != "" {
			line += fmt.Sprintf(", %s egress[%d] %s", "rule", i, p.RuleMode(&p.Egress[i]))
		}
	}
	return line
}
