package egressd

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// Process attribution of flow records (audit/README.md, "Flow records";
// docs/architecture.md, "Process attribution"). The kernel names the process behind a
// flow when it connects or sends (datapath.Process: pid, parent, process group, comm,
// start time); the record adds what the host's /proc still says of that process,
// checked to be the same process by its start time: the executable's path, the
// command line (cut at maxCmdline bytes) and the ids in the sandbox's pid namespace.
// Nothing of it comes from execd.

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
// extra.process_group.pgid is the same) or one a process made for itself.
func processExtra(p *datapath.Process, initPID int) (proc, exec map[string]any) {
	proc = map[string]any{"pid": p.PID, "tid": p.TID, "ppid": p.PPID, "pgid": p.PGID, "name": p.Comm}
	if p.Start > 0 {
		proc["start_ns"] = int64(p.Start)
	}
	dir := procRoot + "/" + strconv.FormatUint(uint64(p.PID), 10)
	if procStart(dir) == p.Start/(time.Second/clkTck) && p.Start > 0 {
		if exe, err := os.Readlink(dir + "/exe"); err == nil {
			proc["exe"] = strings.TrimSuffix(exe, " (deleted)")
		}
		if b, err := os.ReadFile(dir + "/cmdline"); err == nil && len(b) > 0 {
			b = []byte(strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " "))
			if len(b) > maxCmdline {
				b, proc["cmdline_truncated"] = b[:maxCmdline], true
			}
			proc["cmdline"] = string(b)
		}
		if pid, pgid := nsIDs(dir); pid > 0 {
			proc["ns_pid"], proc["ns_pgid"] = pid, pgid
		}
	}
	exec = map[string]any{"pgid": p.PGID}
	switch {
	case initPID <= 0:
		exec["by"] = "unknown"
	case int(p.PID) == initPID:
		exec["by"] = "execd"
	case int(p.PGID) == initPID:
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

// nsIDs are the process's pid and process group in its innermost pid namespace
// (the last of NSpid and NSpgid in its status).
func nsIDs(dir string) (pid, pgid int) {
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return 0, 0
	}
	last := func(rest string) int {
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		n, _ := strconv.Atoi(f[len(f)-1])
		return n
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			pid = last(rest)
		} else if rest, ok := strings.CutPrefix(line, "NSpgid:"); ok {
			pgid = last(rest)
		}
	}
	return pid, pgid
}
