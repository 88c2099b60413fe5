package ocsf

import (
	"cmp"
	"path"
	"strings"

	"github.com/airlockdev/airlock/audit/record"
)

// Class uids of agent actions (source execd).
const (
	ClassFileActivity    = 1001
	ClassProcessActivity = 1007
)

// processActivity is Process Activity's activity of an execd operation (extra.op):
// Launch for what starts a command, code, a session, a context or a PTY, Terminate for
// what ends or interrupts one.
var processActivity = map[string]int{
	"command": 1, "session.run": 1, "code": 1, "session.create": 1, "context.create": 1, "pty.open": 1, "pty.attach": 1,
	"command.interrupt": 2, "code.interrupt": 2, "session.close": 2, "context.close": 2, "pty.close": 2,
}

// fileActivity is File System Activity's activity of an execd file operation.
var fileActivity = map[string]int{
	"file.upload": 1, "dir.create": 1, "file.write": 3, "file.delete": 4, "dir.delete": 4, "file.move": 5, "file.chmod": 7,
}

var fileActivityNames = map[int]string{1: "Create", 3: "Update", 4: "Delete", 5: "Rename", 7: "Set Security"}

// execd writes an agent action through execd: File System Activity for a file or
// directory operation, Process Activity for the rest (commands, code, sessions,
// contexts, PTYs). Both name the sandbox as the device and the principal (or the
// Airlock entry point the request came through) as the actor.
func (m Mapper) execd(w *jw, r *record.Record) {
	op := extraString(r, "op")
	if a, ok := fileActivity[op]; ok {
		m.fileEvent(w, r, a)
		return
	}
	activity, ok := processActivity[op]
	name := map[int]string{1: "Launch", 2: "Terminate"}[activity]
	if !ok {
		activity, name = 99, "Other"
	}
	header(w, r, ClassProcessActivity, activity, name, nil)
	execdActor(w, r)
	m.device(w, r.SandboxID)
	w.open("process")
	if cmd := extraString(r, "command"); cmd != "" {
		w.str("cmd_line", cmd)
	}
	switch {
	case op == "code":
		w.str("name", extraString(r, "language"))
	case strings.HasPrefix(op, "pty."):
		w.str("name", "pty")
	}
	uid := extraString(r, "command_id")
	if uid == "" {
		uid = extraString(r, "session_id")
	}
	if uid == "" {
		uid = extraString(r, "request_id")
	}
	w.str("uid", uid)
	if cwd := extraString(r, "cwd"); cwd != "" {
		w.str("working_directory", cwd)
	}
	w.close()
	if code, ok := extraInt(r, "exit_code"); ok {
		w.int("exit_code", code)
	}
	execdDuration(w, r)
	footer(w, r, "command", "cwd", "exit_code", "duration_ms")
}

// fileEvent writes a file or directory operation as File System Activity: the file
// (name, type, path, size, SHA-256) and, for a move, the file it became.
func (m Mapper) fileEvent(w *jw, r *record.Record, activity int) {
	header(w, r, ClassFileActivity, activity, fileActivityNames[activity], nil)
	execdActor(w, r)
	m.device(w, r.SandboxID)
	folder := strings.HasPrefix(extraString(r, "op"), "dir.")
	p := extraString(r, "path")
	w.open("file")
	execdFile(w, p, folder)
	if n, ok := extraInt(r, "size"); ok {
		w.int("size", n)
	}
	if sum := extraString(r, "sha256"); sum != "" {
		w.array("hashes")
		w.open("")
		w.int("algorithm_id", 3)
		w.str("algorithm", "SHA-256")
		w.str("value", sum)
		w.close()
		w.end()
	}
	w.close()
	if d := extraString(r, "dest"); d != "" {
		w.open("file_result")
		execdFile(w, d, folder)
		w.close()
	}
	execdDuration(w, r)
	footer(w, r, "path", "dest", "size", "sha256", "duration_ms")
}

// execdFile writes a file object's name, type and path (a path not given is Unknown).
func execdFile(w *jw, p string, folder bool) {
	name := path.Base(p)
	if p == "" {
		name = "unknown"
	}
	w.str("name", name)
	if folder {
		w.int("type_id", 2)
		w.str("type", "Folder")
	} else {
		w.int("type_id", 1)
		w.str("type", "Regular File")
	}
	w.str("path", p)
}

// execdActor writes who asked: the principal when the record names one, and the
// Airlock entry point the request passed (gateway, server_proxy).
func execdActor(w *jw, r *record.Record) {
	w.open("actor")
	w.str("app_name", "airlock "+strings.ReplaceAll(cmp.Or(extraString(r, "entry"), "execd"), "_", " "))
	if p := extraString(r, "principal"); p != "" {
		w.open("user")
		w.str("uid", p)
		w.str("name", p)
		w.close()
	}
	w.close()
}

// execdDuration writes the request's duration (ms) and its start and end times.
func execdDuration(w *jw, r *record.Record) {
	d, ok := extraInt(r, "duration_ms")
	if !ok {
		return
	}
	w.int("duration", d)
	w.int("start_time", r.Time.UnixMilli())
	w.int("end_time", r.Time.UnixMilli()+d)
}
