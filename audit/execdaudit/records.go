package execdaudit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit/record"
)

// Bounds of a record.
const (
	// maxText is the most of a command's text or code a record keeps; the rest is cut
	// (extra.command_truncated / code_truncated) and the SHA-256 covers all of it.
	maxText = 16 << 10
	// maxItems is the most records one file operation makes (one per path); the rest
	// are counted in the last record's extra.more.
	maxItems = 64
)

// Outcomes (extra.outcome).
const (
	outcomeSuccess    = "success"    // execd answered 2xx (101 for a PTY), and a stream ended complete
	outcomeFailure    = "failure"    // an error status, a non-zero exit, an error event
	outcomeIncomplete = "incomplete" // the stream ended without its last event (client gone, sandbox cut)
)

// records builds the records of a finished action (a.mu not held; Finish ran).
func (a *Action) records(end time.Time) []record.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	base := func() record.Record {
		x := map[string]any{
			"op":          a.op,
			"entry":       a.o.entry,
			"request_id":  a.info.RequestID,
			"status":      a.status,
			"duration_ms": float64(end.Sub(a.start).Microseconds()) / 1000,
		}
		if a.principal != "" {
			x["principal"] = a.principal
		}
		return record.Record{Time: a.start.UTC(), SandboxID: a.info.SandboxID, Source: record.SourceExecd, Proto: "http",
			Src: a.info.Client, Action: "allow", Extra: x}
	}
	outcome := outcomeSuccess
	if a.status == 0 || a.status >= 300 && a.status != http.StatusSwitchingProtocols {
		outcome = outcomeFailure
	}
	rec := base()
	x := rec.Extra
	if a.bodyCut {
		x["body_truncated"] = true
		x["body_bytes"] = a.bodyBytes
	}
	switch a.op {
	case opCommand, opSessionRun, opCode:
		outcome = a.execution(x, outcome)
	case opSessionCreate, opContextCreate, opPTYOpen:
		a.opening(x)
	case opSessionClose, opPTYClose, opPTYAttach, opContextClose:
		if a.id != "" {
			x["session_id"] = a.id
		}
	case opCommandInterrupt, opCodeInterrupt:
		x["command_id"] = a.query.Get("id")
	case opUpload, opWrite, opMove, opChmod, opMkdir, opDelete, opRmdir:
		return a.fileRecords(rec, outcome)
	}
	x["outcome"] = outcome
	rec.Reason = reason(a.op, outcome, x)
	return []record.Record{rec}
}

// execution fills a command's or code's facts: its text (or SHA-256), the exit code,
// the error and execd's execution time; it returns the outcome.
func (a *Action) execution(x map[string]any, outcome string) string {
	var req struct {
		Command    string `json:"command"`
		Code       string `json:"code"`
		Cwd        string `json:"cwd"`
		Background bool   `json:"background"`
		Context    *struct {
			ID       string `json:"id"`
			Language string `json:"language"`
		} `json:"context"`
	}
	parsed := !a.bodyCut && json.Unmarshal(a.body, &req) == nil
	if a.op == opCode {
		if parsed {
			a.text(x, "code", req.Code)
			lang := "python"
			if req.Context != nil {
				if req.Context.Language != "" {
					lang = req.Context.Language
				}
				if req.Context.ID != "" {
					x["context_id"] = req.Context.ID
				}
			}
			x["language"] = lang
		}
	} else if parsed {
		a.text(x, "command", req.Command)
		if req.Background {
			x["background"] = true
		}
	}
	if parsed && req.Cwd != "" {
		x["cwd"] = req.Cwd
	}
	if a.id != "" {
		x["session_id"] = a.id
	}
	if a.commandID != "" {
		x["command_id"] = a.commandID
	}
	switch {
	case len(a.groups) == 1:
		x["process_group"] = a.groups[0]
	case len(a.groups) > 1:
		x["process_group_candidates"] = a.groups
	}
	if a.hasExecMS {
		x["execution_ms"] = a.execMS
	}
	if a.op != opCode {
		if code, ok := a.exitCode(); ok {
			x["exit_code"] = code
		}
	}
	if a.sawErrEvent {
		x["error"] = a.errName
		if a.op == opCode && a.errValue != "" {
			x["error_value"] = cut(a.errValue, 256)
		}
	}
	switch {
	case outcome == outcomeFailure:
	case a.sawErrEvent:
		outcome = outcomeFailure
	case !a.completed:
		outcome = outcomeIncomplete
	}
	return outcome
}

// text writes a command's or code's text under k (k+"_sha256" always), or, with
// HashCommands, only its SHA-256.
func (a *Action) text(x map[string]any, k, s string) {
	sum := sha256.Sum256([]byte(s))
	x[k+"_sha256"] = hex.EncodeToString(sum[:])
	if a.o.cfg.HashCommands {
		return
	}
	if len(s) > maxText {
		s = cut(s, maxText)
		x[k+"_truncated"] = true
	}
	x[k] = s
}

// opening fills what a session, code context or PTY was opened with, and its id.
func (a *Action) opening(x map[string]any) {
	var req struct {
		Cwd      string `json:"cwd"`
		Command  string `json:"command"`
		Language string `json:"language"`
	}
	if !a.bodyCut && len(a.body) > 0 && json.Unmarshal(a.body, &req) == nil {
		if req.Cwd != "" {
			x["cwd"] = req.Cwd
		}
		if req.Command != "" {
			a.text(x, "command", req.Command)
		}
		if req.Language != "" {
			x["language"] = req.Language
		}
	}
	var resp struct {
		SessionID string `json:"session_id"`
		ID        string `json:"id"`
	}
	if json.Unmarshal(a.resp, &resp) == nil {
		if id := resp.SessionID + resp.ID; id != "" {
			x["session_id"] = id
		}
	}
}

// fileItem is one path of a file operation.
type fileItem struct {
	path, dest         string
	size               int64
	sha256             string
	mode, owner, group string
	hasSize            bool
}

// fileRecords makes a record per path of a file operation.
func (a *Action) fileRecords(base record.Record, outcome string) []record.Record {
	items := a.fileItems()
	if len(items) == 0 {
		items = []fileItem{{}}
	}
	more := 0
	if len(items) > maxItems {
		more, items = len(items)-maxItems, items[:maxItems]
	}
	out := make([]record.Record, 0, len(items))
	for i, it := range items {
		rec := base
		x := make(map[string]any, len(base.Extra)+6)
		for k, v := range base.Extra {
			x[k] = v
		}
		set := func(k, v string) {
			if v != "" {
				x[k] = v
			}
		}
		set("path", it.path)
		set("dest", it.dest)
		set("sha256", it.sha256)
		set("mode", it.mode)
		set("owner", it.owner)
		set("group", it.group)
		if it.hasSize {
			x["size"] = it.size
		}
		if more > 0 && i == len(items)-1 {
			x["more"] = more
		}
		o := outcome
		if a.op == opUpload && it.path != "" && !it.hasSize {
			o = outcomeIncomplete // the body ended before the file did
		}
		x["outcome"] = o
		rec.Extra = x
		rec.Reason = reason(a.op, o, x)
		out = append(out, rec)
	}
	return out
}

// fileItems reads the paths of a file operation from its query or body.
func (a *Action) fileItems() []fileItem {
	var out []fileItem
	switch a.op {
	case opUpload:
		if a.upload == nil {
			return nil
		}
		for _, f := range a.upload.result() {
			out = append(out, fileItem{path: f.path, size: f.size, sha256: f.sha256, hasSize: f.complete, mode: f.mode,
				owner: f.owner, group: f.group})
		}
	case opDelete, opRmdir:
		for _, p := range a.query["path"] {
			out = append(out, fileItem{path: p})
		}
	case opMove:
		var req []struct {
			Src  string `json:"src"`
			Dest string `json:"dest"`
		}
		if json.Unmarshal(a.body, &req) == nil {
			for _, it := range req {
				out = append(out, fileItem{path: it.Src, dest: it.Dest})
			}
		}
	case opWrite:
		var req map[string]json.RawMessage
		if json.Unmarshal(a.body, &req) == nil {
			for _, p := range sortedKeys(req) {
				out = append(out, fileItem{path: p})
			}
		}
	case opChmod, opMkdir:
		var req map[string]struct {
			Owner string `json:"owner"`
			Group string `json:"group"`
			Mode  *int   `json:"mode"`
		}
		if json.Unmarshal(a.body, &req) == nil {
			for _, p := range sortedKeys(req) {
				it := fileItem{path: p, owner: req[p].Owner, group: req[p].Group}
				if m := req[p].Mode; m != nil {
					it.mode = strconv.Itoa(*m)
				}
				out = append(out, it)
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// reason is the record's one-line summary (OCSF message): the operation, its subject
// when it is not secret-shaped (a path, an exit code; never a command's text) and the
// outcome.
func reason(op, outcome string, x map[string]any) string {
	s := "execd " + op
	if p, ok := x["path"].(string); ok {
		s += " " + p
		if d, ok := x["dest"].(string); ok {
			s += " -> " + d
		}
	}
	if c, ok := x["exit_code"].(int); ok {
		s += fmt.Sprintf(": exit %d", c)
	} else if e, ok := x["error"].(string); ok {
		s += ": " + e
	}
	return s + " (" + outcome + ")"
}

// cut shortens s to at most n bytes without splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}
