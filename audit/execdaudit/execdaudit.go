// Package execdaudit records the agent actions that reach a sandbox's execd: commands
// and code executions (text or SHA-256, exit code, duration), bash sessions, code
// contexts and PTY sessions opened and closed, and files uploaded, written, moved,
// deleted or given new permissions (path, size, SHA-256). Each becomes an audit record
// of source execd (audit/README.md, "Agent actions") in the same hash-chained log as
// every other decision.
//
// execd runs inside the sandbox, where the code it runs can reach it, so nothing it
// says about itself is evidence. The records are made on the host, at the two places
// every execd request passes: the gateway (package gateway) and lifecycle's server
// proxy (package lifecycle). Both call Observer.Start before proxying and Action.Finish
// after the response: the request body is observed as the proxy reads it (a bounded
// copy of JSON bodies; uploads are parsed and hashed as they stream, never held), the
// response as it is written (the status, and the stream's init, execution_complete and
// error events, scanned line by line and never buffered), so the proxy's latency grows
// only by the scan. Requests that only read (ping, metrics, file info, downloads,
// listings, status, logs) are not recorded.
package execdaudit

import (
	"net/http"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit/record"
	"github.com/airlockdev/airlock/principal"
)

// Sink receives the records; audit.Writer is one. Append must not block for long.
type Sink interface {
	Append(record.Record)
}

// Config is the operator's choice of what a record keeps (airlock.yaml
// audit.agentActions).
type Config struct {
	// Disabled turns agent action records off.
	Disabled bool `yaml:"disabled" json:"disabled,omitempty"`
	// HashCommands stores the SHA-256 of a command's text and of executed code
	// (extra.command_sha256, extra.code_sha256) instead of the text itself.
	HashCommands bool `yaml:"hashCommands" json:"hash_commands,omitempty"`
}

// Observer makes the records of one entry point. The zero value records nothing;
// New gives one that does.
type Observer struct {
	sink  Sink
	cfg   Config
	entry string
}

// New returns the observer of an entry point ("gateway" or "server_proxy", written as
// extra.entry) writing to sink, or nil when sink is nil or cfg.Disabled: a nil
// *Observer's Start returns nil.
func New(sink Sink, cfg Config, entry string) *Observer {
	if sink == nil || cfg.Disabled {
		return nil
	}
	return &Observer{sink: sink, cfg: cfg, entry: entry}
}

// Info is what the proxy knows of a request: the sandbox, the request id (the
// X-Request-Id it answers with) and the client's address (ip:port).
//
// InitPID is the host pid of the sandbox's init (execd; watch.Runtime.Pid), from the
// runtime, not from the sandbox: with it a command's record names the process group
// the command runs in (extra.process_group), which flow records name too. 0: none.
type Info struct {
	SandboxID string
	RequestID string
	Client    string
	InitPID   int
	// Groups, when set, starts the look for a command's process group in place of
	// InitPID's (which needs the sandbox's host /proc): the gateway on Kubernetes asks
	// the sandbox's node's egressd (RemoteGroups). It returns within a short bound, nil
	// for no look; the watch's End(true) then runs off the response's path and the
	// command's record is appended once it answers (bounded by the source's timeout).
	Groups func() GroupWatch
}

// Start returns the Action of r when r is an agent action, nil otherwise (and for a
// nil o). path is execd's path of the request (the proxy's prefix removed, not
// escaped). When an Action is returned, r.Body has been replaced by a reader that
// observes the body as the proxy reads it; call Finish once the response has ended.
func (o *Observer) Start(r *http.Request, path string, info Info) *Action {
	if o == nil {
		return nil
	}
	op, id := classify(r.Method, path)
	if op == "" {
		return nil
	}
	a := &Action{o: o, op: op, id: id, info: info, start: time.Now(), query: r.URL.Query(),
		principal: principal.IDFromContext(r.Context())}
	if op == opCommand {
		switch {
		case info.Groups != nil:
			a.watch, a.remote = info.Groups(), true
		case info.InitPID > 0:
			a.watch = WatchGroups(info.InitPID, BootNow())
		}
	}
	switch op {
	case opCommand, opSessionRun, opCode:
		a.stream = true
	case opSessionCreate, opPTYOpen, opContextCreate:
		a.keepResponse = true
	}
	if r.Body != nil && r.Body != http.NoBody {
		if op == opUpload {
			a.upload = newUploadParser(r.Header.Get("Content-Type"))
		}
		if a.upload != nil || bodyOps[op] {
			r.Body = &bodyTee{rc: r.Body, a: a}
		}
	}
	return a
}

// Operations (extra.op).
const (
	opCommand          = "command"           // POST /command
	opCommandInterrupt = "command.interrupt" // DELETE /command?id=
	opSessionCreate    = "session.create"    // POST /session
	opSessionRun       = "session.run"       // POST /session/{id}/run
	opSessionClose     = "session.close"     // DELETE /session/{id}
	opCode             = "code"              // POST /code
	opCodeInterrupt    = "code.interrupt"    // DELETE /code?id=
	opContextCreate    = "context.create"    // POST /code/context
	opContextClose     = "context.close"     // DELETE /code/contexts[/{id}]
	opPTYOpen          = "pty.open"          // POST /pty
	opPTYAttach        = "pty.attach"        // GET /pty/{id}/ws (the WebSocket, for its whole life)
	opPTYClose         = "pty.close"         // DELETE /pty/{id}
	opUpload           = "file.upload"       // POST /files/upload
	opWrite            = "file.write"        // POST /files/replace
	opMove             = "file.move"         // POST /files/mv
	opDelete           = "file.delete"       // DELETE /files?path=
	opChmod            = "file.chmod"        // POST /files/permissions
	opMkdir            = "dir.create"        // POST /directories
	opRmdir            = "dir.delete"        // DELETE /directories?path=
)

// bodyOps are the operations whose JSON body the record reads.
var bodyOps = map[string]bool{opCommand: true, opSessionCreate: true, opSessionRun: true, opCode: true,
	opContextCreate: true, opPTYOpen: true, opWrite: true, opMove: true, opChmod: true, opMkdir: true}

// classify names the operation of an execd request (execd/README.md's routes) and the
// id in its path ("" for none); op is "" for a request that is not recorded.
func classify(method, path string) (op, id string) {
	path = "/" + strings.Trim(path, "/")
	seg := strings.Split(path[1:], "/")
	switch method {
	case http.MethodPost:
		switch {
		case path == "/command":
			return opCommand, ""
		case path == "/session":
			return opSessionCreate, ""
		case len(seg) == 3 && seg[0] == "session" && seg[2] == "run":
			return opSessionRun, seg[1]
		case path == "/code":
			return opCode, ""
		case path == "/code/context":
			return opContextCreate, ""
		case path == "/pty":
			return opPTYOpen, ""
		case path == "/files/upload":
			return opUpload, ""
		case path == "/files/replace":
			return opWrite, ""
		case path == "/files/mv":
			return opMove, ""
		case path == "/files/permissions":
			return opChmod, ""
		case path == "/directories":
			return opMkdir, ""
		}
	case http.MethodDelete:
		switch {
		case path == "/command":
			return opCommandInterrupt, ""
		case path == "/code":
			return opCodeInterrupt, ""
		case len(seg) == 2 && seg[0] == "session":
			return opSessionClose, seg[1]
		case len(seg) == 2 && seg[0] == "pty":
			return opPTYClose, seg[1]
		case path == "/code/contexts":
			return opContextClose, ""
		case len(seg) == 3 && seg[0] == "code" && seg[1] == "contexts":
			return opContextClose, seg[2]
		case path == "/files":
			return opDelete, ""
		case path == "/directories":
			return opRmdir, ""
		}
	case http.MethodGet:
		if len(seg) == 3 && seg[0] == "pty" && seg[2] == "ws" {
			return opPTYAttach, seg[1]
		}
	}
	return "", ""
}
