package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
)

func newAuditQueryCmd() *cobra.Command {
	var (
		dir, sandbox, principal, command, since, until, output string
		kinds                                                  []string
		limit                                                  int
	)
	c := &cobra.Command{
		Use:   "query",
		Short: "Find audit records by principal, sandbox, command, kind and time",
		Long: `Reads the audit log's chain files (--dir, the audit directory of 'airlock up', egressd
or the gateway) and prints the records every given selector matches, oldest first:

  --principal ID   records naming this principal (an API key's id, 'airlock key whoami'):
                   the control-plane calls it made (create, delete, renew, pause and
                   resume, policy and vault changes, key management, signed URLs,
                   snapshots, and its refused calls) and the agent actions it sent
                   through execd
  --sandbox ID     records of one sandbox: its DNS answers, flows, gateway requests,
                   agent actions, policy changes and the control-plane calls on it
  --command TEXT   records whose command text contains TEXT: execd commands and code
                   (not when stored hashed, audit.agentActions.hashCommands), and flows
                   whose record carries the command line of the process that opened them
  --kind K[,K]     control, execd, dns, flow, http (gateway, ingress, l7 and credential),
                   policy, or a source by name (bpf, gateway, ingress, l7, credential)
  --since, --until an RFC 3339 time (2026-11-22T18:00:00Z) or a duration meaning that
                   long ago (90m, 24h); since <= time < until

The output is a table (--output table, the default: time, seq, kind, sandbox,
principal, action and a summary) or the records themselves as JSON Lines (--output
json), the same records 'airlock audit verify' proves. At most --limit records are
printed (default 1000); a note on stderr says when more matched. Reading does not
verify the chain: run 'airlock audit verify DIR' for that.`,
		Example: `  airlock audit query --principal pk_3f2a --kind control --since 24h
  airlock audit query --sandbox k61z2906630iy39x --output json
  airlock audit query --command "pip install" --kind execd,flow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := audit.Filter{SandboxID: sandbox}
			now := time.Now()
			var err error
			if f.Since, err = queryTime("--since", since, now); err != nil {
				return err
			}
			if f.Until, err = queryTime("--until", until, now); err != nil {
				return err
			}
			if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
				return errors.New("--since must be before --until")
			}
			if limit < 1 {
				return errors.New("--limit must be at least 1")
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			sel := audit.Selector{Principal: principal, Command: command}
			var names []string
			for _, k := range kinds {
				names = append(names, strings.Split(k, ",")...)
			}
			if sel.Sources, err = audit.ParseKinds(names); err != nil {
				return fmt.Errorf("--kind: %w", err)
			}
			var recs []audit.Record
			more := false
			stop := errors.New("stop")
			err = audit.Scan(dir, f, func(r audit.Record) error {
				if !sel.Match(&r) {
					return nil
				}
				if len(recs) == limit {
					more = true
					return stop
				}
				recs = append(recs, r)
				return nil
			})
			if err != nil && !errors.Is(err, stop) {
				return fmt.Errorf("reading %s: %w", dir, err)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetEscapeHTML(false)
				for _, r := range recs {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
			} else if err := writeRecordTable(out, recs); err != nil {
				return err
			}
			if more {
				fmt.Fprintf(cmd.ErrOrStderr(), "more than %d records match: narrow the query or raise --limit\n", limit)
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&dir, "dir", defaultAuditDir, "audit log directory")
	fl.StringVar(&principal, "principal", "", "only records of this principal id")
	fl.StringVar(&sandbox, "sandbox", "", "only records of this sandbox id")
	fl.StringVar(&command, "command", "", "only records whose command text contains this")
	fl.StringSliceVar(&kinds, "kind", nil, "only records of these kinds: "+strings.Join(audit.KindNames(), ", "))
	fl.StringVar(&since, "since", "", "only records at or after this RFC 3339 time, or this long ago (24h)")
	fl.StringVar(&until, "until", "", "only records before this RFC 3339 time, or this long ago")
	fl.StringVarP(&output, "output", "o", "table", "table or json (JSON Lines)")
	fl.IntVar(&limit, "limit", 1000, "print at most this many records")
	return c
}

// queryTime parses a --since or --until value: empty (no bound), an RFC 3339 time, or
// a positive duration before now.
func queryTime(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time (2026-11-22T18:00:00Z) or a duration ago (90m, 24h)", name, v)
}

// kindOf is the kind a record is listed under in the table.
func kindOf(r *audit.Record) string {
	switch r.Source {
	case audit.SourceBPF:
		return "flow"
	case audit.SourceGateway, audit.SourceIngress, audit.SourceL7, audit.SourceCredential:
		return "http/" + string(r.Source)
	}
	return string(r.Source)
}

// writeRecordTable prints recs as a table, one line each.
func writeRecordTable(w io.Writer, recs []audit.Record) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tSEQ\tKIND\tSANDBOX\tPRINCIPAL\tACTION\tSUMMARY")
	for i := range recs {
		r := &recs[i]
		p, _ := r.Extra["principal"].(string)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), r.Seq, kindOf(r),
			dash(r.SandboxID), dash(p), r.Action, summary(r))
	}
	return tw.Flush()
}

// summary is one line about r: what was asked and what came of it.
func summary(r *audit.Record) string {
	x := func(k string) string {
		switch v := r.Extra[k].(type) {
		case string:
			return v
		case float64:
			return strconv.FormatFloat(v, 'f', -1, 64)
		case nil:
			return ""
		default:
			return fmt.Sprint(v)
		}
	}
	var s string
	switch r.Source {
	case audit.SourceControl:
		s = strings.TrimSpace(x("op")+" "+x("target")) + " → " + x("status")
		if r.Action == "deny" {
			s += ": " + r.Reason
		}
	case audit.SourceExecd:
		s = x("op")
		if t := cmp.Or(x("command"), x("code"), x("path")); t != "" {
			s += " " + strconv.Quote(truncate(t, 80))
		}
		if e := x("exit_code"); e != "" {
			s += " exit " + e
		}
		if o := x("outcome"); o != "" {
			s += " (" + o + ")"
		}
	case audit.SourceDNS:
		s = strings.TrimSpace(r.QType + " " + r.DstHost + " " + x("rcode"))
	case audit.SourceBPF:
		s = fmt.Sprintf("%s → %s:%d", r.Proto, cmp.Or(r.DstHost, r.DstIP), r.DstPort)
		if c := commandLine(r); c != "" {
			s += " by " + strconv.Quote(truncate(c, 60))
		}
	default:
		s = r.Reason
		if h := cmp.Or(r.DstHost, r.DstIP); h != "" {
			s = strings.TrimSpace(x("method") + " " + h + x("path") + " " + x("status") + " " + r.Reason)
		}
	}
	return strings.ReplaceAll(s, "\n", " ")
}

// commandLine is the command line of the process a flow record names, if any.
func commandLine(r *audit.Record) string {
	if p, ok := r.Extra["process"].(map[string]any); ok {
		for _, k := range []string{"cmdline", "cmd_line", "exe"} {
			if s, ok := p[k].(string); ok && s != "" {
				return s
			}
		}
	}
	s, _ := r.Extra["cmdline"].(string)
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
