// Package doctor checks a host for Airlock: one row per prerequisite of `airlock up`
// (root, kernel and BTF, bpffs, TCX or clsact, cgroup v2, nftables over netlink, the
// Docker engine, the Airlock network, free ports, the sandbox image, the state
// directory, the audit log's disk use, Node for the SDK tests), each ok, missing or degraded, with the fix.
// `airlock doctor` prints the report; `airlock up` refuses to start when a hard row
// fails. Every fact comes through Host, so tests can fake each failure.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is a row's outcome.
type Status string

// Row statuses.
const (
	// OK: the prerequisite is met.
	OK Status = "ok"
	// Missing: the prerequisite is not met; with Hard, the stack cannot run.
	Missing Status = "missing"
	// Degraded: the stack runs without it, with less (a fallback datapath, no SDK
	// tests, sandbox creates failing until the image is built).
	Degraded Status = "degraded"
)

// Row is one checked prerequisite.
type Row struct {
	// Check names the prerequisite ("docker engine").
	Check string `json:"check"`
	// Status is ok, missing or degraded.
	Status Status `json:"status"`
	// Detail is what was found ("20.10.24, API 1.41").
	Detail string `json:"detail"`
	// Fix is the command or setting that meets it; empty when ok.
	Fix string `json:"fix,omitempty"`
	// Hard is true when the stack cannot run unless the row is ok.
	Hard bool `json:"hard"`
}

// Failed reports whether the row keeps the stack from running.
func (r Row) Failed() bool { return r.Hard && r.Status != OK }

// Report is the outcome of Run, rows in a fixed order.
type Report struct {
	Rows []Row `json:"rows"`
	// OK is true when no hard row failed: the stack can run.
	OK bool `json:"ok"`
}

// Row returns the row named check and whether it exists.
func (r Report) Row(check string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Check == check {
			return row, true
		}
	}
	return Row{}, false
}

// ErrHostNotReady is wrapped by Report.Err.
var ErrHostNotReady = errors.New("this host cannot run Airlock")

// Err is nil when the stack can run, else an error (wrapping ErrHostNotReady) naming
// every failing hard row with its fix, one per line.
func (r Report) Err() error {
	var b strings.Builder
	n := 0
	for _, row := range r.Rows {
		if row.Failed() {
			n++
			fmt.Fprintf(&b, "\n  %s: %s (%s); fix: %s", row.Check, row.Status, row.Detail, row.Fix)
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d problem(s) (airlock doctor shows every check):%s", ErrHostNotReady, n, b.String())
}

// WriteTable prints the rows as aligned columns and a closing verdict line.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL\tFIX")
	for _, row := range r.Rows {
		status := string(row.Status)
		if row.Failed() {
			status += " (hard)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row.Check, status, row.Detail, row.Fix)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	hard := 0
	for _, row := range r.Rows {
		if row.Failed() {
			hard++
		}
	}
	if hard == 0 {
		_, err := fmt.Fprintln(w, "\nok: the stack can run on this host")
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d hard problem(s): the stack cannot run on this host until they are fixed\n", hard)
	return err
}

// WriteJSON prints the report as one JSON object ({"rows": [...], "ok": bool}).
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Run checks the host described by cfg. It never fails: what it cannot check is a row
// that says so.
func Run(ctx context.Context, cfg Config) Report {
	cfg.setDefaults()
	c := &checker{cfg: cfg, h: cfg.Host}
	rows := []Row{
		c.root(),
		c.kernel(),
		c.bpffs(),
		c.tcHook(),
		c.cgroup2(),
		c.nftables(),
		c.docker(ctx),
		c.network(ctx),
	}
	rows = append(rows, c.ports()...)
	rows = append(rows, c.image(ctx), c.stateDir())
	if cfg.AuditDir != "" {
		rows = append(rows, c.auditDisk())
	}
	rows = append(rows, c.node())
	rep := Report{Rows: rows, OK: true}
	for _, row := range rows {
		if row.Failed() {
			rep.OK = false
		}
	}
	return rep
}
