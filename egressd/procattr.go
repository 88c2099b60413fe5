package egressd

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Process attribution of flow records (audit/README.md, "Flow records";
// docs/architecture.md, "A flow names its process; the kernel is the witness"). The
// kernel names the process behind a flow when it connects or sends
// (datapath.Process: pid, parent, process group, ids in the sandbox, comm, the
// executable's name, the first 128 bytes of the command line, start time); the record
// adds what the host's /proc still says of that process, checked to be the same
// process by its start time: the executable's full path, and the command line up to
// maxCmdline bytes when the kernel's was cut. Nothing of it comes from execd.

// maxCmdline is the most of a command line a flow record keeps (bytes).
const maxCmdline = 256

// procRoot is the host's /proc (the ids the kernel reports are the host's).
var procRoot = "/proc"

// clkTck is USER_HZ, the unit of /proc/<pid>/stat's starttime.
const clkTck = 100

// processExtra returns the flow record's extra.process and extra.execution for p, the
// process the kernel saw, in the sandbox whose init (execd) has host pid initPID (0:
// unknown). extra.execution.by is "execd" for execd itself, "entrypoint" for a process
// in execd's own process group (the entrypoint execd supervises runs there), and
// "group" for any other group: an execd command's (its record's
// extra.process_group.pgid is the same) or one a process made for itself. Without the
// init's host pid (a pod: egressd sees no pid of it), the kernel's ids in the
// sandbox's own pid namespace say the same: execd is 1 there, its group 1. "unknown"
// when neither is known.
func processExtra(p *datapath.Process, initPID int) (proc, exec map[string]any) {
	proc = map[string]any{"pid": p.PID, "tid": p.TID, "ppid": p.PPID, "pgid": p.PGID, "name": p.Comm}
	if p.Start > 0 {
		proc["start_ns"] = int64(p.Start)
	}
	if p.NSPID > 0 {
		proc["ns_pid"], proc["ns_pgid"] = p.NSPID, p.NSPGID
	}
	if p.Exe != "" {
		proc["exe_name"] = p.Exe
	}
	if len(p.Args) > 0 {
		proc["cmdline"] = strings.Join(p.Args, " ")
		if p.ArgsCut {
			proc["cmdline_truncated"] = true
		}
	}
	dir := procRoot + "/" + strconv.FormatUint(uint64(p.PID), 10)
	if p.Start > 0 && procStart(dir) == p.Start/(time.Second/clkTck) {
		if exe, err := os.Readlink(dir + "/exe"); err == nil {
			proc["exe"] = strings.TrimSuffix(exe, " (deleted)")
		}
		if b, err := os.ReadFile(dir + "/cmdline"); err == nil && len(b) > 0 && (len(p.Args) == 0 || p.ArgsCut) {
			b = []byte(strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " "))
			proc["cmdline_truncated"] = len(b) > maxCmdline
			proc["cmdline"] = string(b[:min(len(b), maxCmdline)])
		}
	}
	exec = map[string]any{"pgid": p.PGID}
	pid, pgid, init := int(p.PID), int(p.PGID), initPID
	if initPID <= 0 && p.NSPID > 0 {
		pid, pgid, init = int(p.NSPID), int(p.NSPGID), 1
	}
	switch {
	case init <= 0:
		exec["by"] = "unknown"
	case pid == init:
		exec["by"] = "execd"
	case pgid == init:
		exec["by"] = "entrypoint"
	default:
		exec["by"] = "group"
	}
	return proc, exec
}

// procStart is the starttime (clock ticks since boot) of the process at dir, -1 when
// it is gone.
func procStart(dir string) time.Duration {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return -1
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return -1
	}
	return time.Duration(n)
}
