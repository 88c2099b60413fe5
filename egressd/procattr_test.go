package egressd

import (
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// TestExecutionBy: a flow's process is execd's, the entrypoint's or a group's by the
// init's host pid when known (Docker), else by the ids in the sandbox's own pid
// namespace, where execd is 1 (a pod); "unknown" with neither.
func TestExecutionBy(t *testing.T) {
	old := procRoot
	procRoot = t.TempDir() // no process of the host: only the kernel's fields
	t.Cleanup(func() { procRoot = old })
	for _, c := range []struct {
		name    string
		p       datapath.Process
		initPID int
		want    string
	}{
		{"execd, host pid known", datapath.Process{PID: 500, PGID: 500, NSPID: 1, NSPGID: 1}, 500, "execd"},
		{"entrypoint, host pid known", datapath.Process{PID: 510, PGID: 500, NSPID: 7, NSPGID: 1}, 500, "entrypoint"},
		{"a command's group, host pid known", datapath.Process{PID: 520, PGID: 520, NSPID: 9, NSPGID: 9}, 500, "group"},
		{"execd in a pod", datapath.Process{PID: 900, PGID: 900, NSPID: 1, NSPGID: 1}, 0, "execd"},
		{"entrypoint in a pod", datapath.Process{PID: 910, PGID: 900, NSPID: 7, NSPGID: 1}, 0, "entrypoint"},
		{"a command's group in a pod", datapath.Process{PID: 920, PGID: 920, NSPID: 12, NSPGID: 12}, 0, "group"},
		{"nothing known", datapath.Process{PID: 930, PGID: 930}, 0, "unknown"},
	} {
		_, exec := processExtra(&c.p, c.initPID)
		if exec["by"] != c.want || exec["pgid"] != c.p.PGID {
			t.Errorf("%s: execution %v, want by %s, pgid %d", c.name, exec, c.want, c.p.PGID)
		}
	}
}
