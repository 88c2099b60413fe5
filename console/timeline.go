package console

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
)

// timelineMax bounds the records one timeline reads (the newest commands win).
const timelineMax = 20000

// timelineCommands bounds the commands one timeline answers with (the newest).
const timelineCommands = 200

// TimelineEntry is one agent action of a sandbox's timeline (GET
// /console/api/sandboxes/{id}/timeline): the execd record (a command, code or session
// run) and the flows and DNS answers it opened.
type TimelineEntry struct {
	Command audit.Record `json:"command"`
	// End is when the command ended: its record's time plus duration_ms.
	End time.Time `json:"end"`
	// Flows are the sandbox's flow (source bpf) and DNS records linked to the command:
	// by extra.execution (the command's command_id or request_id) when a flow record
	// carries one, else by time (at or after the command's start and before its end).
	Flows []audit.Record `json:"flows"`
	// LinkedBy says how the flows were linked: "execution" when at least one flow
	// record named the command, "time" otherwise.
	LinkedBy string `json:"linkedBy"`
}

// TimelineResponse is the answer of GET /console/api/sandboxes/{id}/timeline.
type TimelineResponse struct {
	Entries []TimelineEntry `json:"entries"`
	// Unlinked counts the sandbox's flow and DNS records no command claimed (started
	// outside every command: the entrypoint, a background process, a server).
	Unlinked int `json:"unlinked"`
}

// commandOps are the execd ops a timeline lists.
var commandOps = map[string]bool{"command": true, "code": true, "session.run": true}

// handleTimeline answers a sandbox's timeline: its commands through execd, oldest
// first, each followed by the flows it opened. Like the live stream it needs the
// sandbox to be visible to the session's key (the API decides: a user sees its own
// sandboxes only).
func (c *Console) handleTimeline(w http.ResponseWriter, r *http.Request) {
	id, ok := c.auditedSandbox(w, r)
	if !ok {
		return
	}
	var cmds, flows []audit.Record
	n := 0
	errFull := errors.New("full")
	err := audit.Scan(c.cfg.AuditDir, audit.Filter{SandboxID: id}, func(rec audit.Record) error {
		if n++; n > timelineMax {
			return errFull
		}
		switch {
		case rec.Source == audit.SourceExecd && commandOps[str(rec.Extra["op"])]:
			cmds = append(cmds, rec)
		case rec.Source == audit.SourceBPF || rec.Source == audit.SourceDNS:
			flows = append(flows, rec)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		c.log.Error("reading the audit log failed", "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "reading the audit log failed")
		return
	}
	if len(cmds) > timelineCommands {
		cmds = cmds[len(cmds)-timelineCommands:]
	}
	resp := TimelineResponse{Entries: buildTimeline(cmds, flows)}
	claimed := 0
	for _, e := range resp.Entries {
		claimed += len(e.Flows)
	}
	resp.Unlinked = len(flows) - claimed
	opensandbox.WriteJSON(w, http.StatusOK, resp)
}

// buildTimeline links flows to cmds (both in seq order): a flow naming an execution
// (extra.execution: a command's command_id or request_id, as a string or in an
// object's "id", "command_id" or "request_id") goes to that command; a flow whose
// process the kernel saw in a command's process group (extra.execution.pgid of the
// flow, extra.process_group.pgid of the command: audit/README.md, process
// attribution) goes to the latest such command started before it, background jobs
// included; a flow the kernel attributes to the entrypoint or execd itself to none;
// any other flow to the latest command whose time window holds it. A flow is listed
// once.
func buildTimeline(cmds, flows []audit.Record) []TimelineEntry {
	entries := make([]TimelineEntry, len(cmds))
	byExec := map[string]int{}
	for i, cmd := range cmds {
		ms, _ := cmd.Extra["duration_ms"].(float64)
		entries[i] = TimelineEntry{Command: cmd, End: cmd.Time.Add(time.Duration(ms * float64(time.Millisecond))),
			Flows: []audit.Record{}, LinkedBy: "time"}
		for _, k := range []string{"command_id", "request_id"} {
			if v := str(cmd.Extra[k]); v != "" {
				byExec[v] = i
			}
		}
	}
	byGroup := map[int64][]int{} // process group → commands with that group, in order
	for i, cmd := range cmds {
		if g, ok := pgidOf(cmd.Extra["process_group"]); ok {
			byGroup[g] = append(byGroup[g], i)
		}
	}
	for _, f := range flows {
		if i, ok := byExec[executionOf(f)]; ok {
			entries[i].Flows = append(entries[i].Flows, f)
			entries[i].LinkedBy = "execution"
			continue
		}
		if i, ok := groupCommand(byGroup, cmds, f); ok {
			entries[i].Flows = append(entries[i].Flows, f)
			entries[i].LinkedBy = "process_group"
			continue
		}
		if x, _ := f.Extra["execution"].(map[string]any); x != nil && (x["by"] == "entrypoint" || x["by"] == "execd") {
			continue // the kernel saw the entrypoint or execd open it: no command's
		}
		for i := len(entries) - 1; i >= 0; i-- {
			e := &entries[i]
			if !f.Time.Before(e.Command.Time) && f.Time.Before(e.End) {
				e.Flows = append(e.Flows, f)
				break
			}
		}
	}
	return entries
}

// executionOf is the execution a flow record names, "" when none.
func executionOf(f audit.Record) string {
	switch v := f.Extra["execution"].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case map[string]any:
		for _, k := range []string{"id", "command_id", "request_id"} {
			if s := str(v[k]); s != "" {
				return s
			}
		}
	}
	return ""
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// pgidOf reads the "pgid" of an extra object (extra.process_group, extra.execution).
func pgidOf(v any) (int64, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return 0, false
	}
	g, ok := m["pgid"].(float64)
	return int64(g), ok && g > 0
}

// groupCommand is the command whose process group the flow's process was in: the
// latest one with that group that started before the flow.
func groupCommand(byGroup map[int64][]int, cmds []audit.Record, f audit.Record) (int, bool) {
	x, _ := f.Extra["execution"].(map[string]any)
	if x == nil || x["by"] != "group" {
		return 0, false
	}
	g, ok := pgidOf(x)
	if !ok {
		return 0, false
	}
	idx := byGroup[g]
	for j := len(idx) - 1; j >= 0; j-- {
		if !f.Time.Before(cmds[idx[j]].Time) {
			return idx[j], true
		}
	}
	return 0, false
}
