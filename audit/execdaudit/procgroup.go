package execdaudit

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Process groups of commands (extra.process_group), the link from a flow record to the
// command that opened it (docs/architecture.md, "A flow names its process; the
// kernel is the witness").
//
// execd starts every command in a process group of its own, led by the command's
// first process, a child of execd (the sandbox's init); every process the command
// starts stays in that group, a background job re-parented to execd included. The
// kernel names the group of the process behind each flow (extra.execution.pgid of a
// flow record). This side finds the group on the host, from /proc, when execd's init
// event says the command started: the groups of execd's children that started after
// the request arrived (watched from then on, so that a command already ended is
// still seen) and that no other command took. execd's answer only tells when
// to look; what it says is not used. Ids are the host's (pid namespace of /proc).

// procRoot is where the host's /proc is mounted (tests may point it elsewhere).
var procRoot = "/proc"

// clkTck is USER_HZ, the unit of /proc/<pid>/stat's starttime (100 on Linux).
const clkTck = 100

// claimKeep is how long a taken group stays taken; a group older than the request is
// never a candidate, so only commands started together need the claims.
const claimKeep = time.Minute

var claims = struct {
	sync.Mutex
	m map[[2]int]time.Time // {init pid, pgid} -> when taken
}{m: map[[2]int]time.Time{}}

// ProcGroup is a command's process group (extra.process_group of its record): PGID the
// host's pgid, NSPGID the same in the sandbox's pid namespace (0 when /proc did not
// say).
type ProcGroup struct {
	PGID   int `json:"pgid"`
	NSPGID int `json:"ns_pgid,omitempty"`
}

// GroupWatch is a look for one command's process group, started at the command's
// arrival: WatchGroups on the host that runs the sandbox, RemoteGroups through the
// sandbox's node's egressd (Kubernetes).
type GroupWatch interface {
	// End stops looking. With take it claims the command's group among those seen
	// (see takeGroups): one group, or several left untaken with ambiguous set; none
	// (nil) when nothing new was seen or the source failed. Without take it returns
	// nil. A watch ends once; later calls return nil.
	End(take bool) (groups []ProcGroup, ambiguous bool)
}

// WatchGroups starts looking, on this host's /proc, for the groups of initPID's
// children (initPID: the sandbox's init, execd, as a host pid) that start no earlier
// than since (CLOCK_BOOTTIME, BootNow), every watchTick then watchSlow, for at most
// WatchMax; End takes from what it saw.
func WatchGroups(initPID int, since time.Duration) GroupWatch {
	return watchGroups(initPID, since)
}

// End implements GroupWatch.
func (w *groupWatch) End(take bool) ([]ProcGroup, bool) {
	if w == nil {
		return nil, false
	}
	found := w.end()
	if !take || w.taken {
		return nil, false
	}
	w.taken = true
	return takeGroups(w.initPID, found)
}

// statFields returns ppid, pgrp and starttime (since boot) from /proc/<pid>/stat.
func statFields(pid int) (ppid, pgrp int, start time.Duration, ok bool) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp session tty tpgid flags ... starttime (index 19)
	if len(f) < 20 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	ticks, _ := strconv.ParseInt(f[19], 10, 64)
	return ppid, pgrp, time.Duration(ticks) * (time.Second / clkTck), true
}

// nsPGID is the last NSpgid of /proc/<pid>/status: the group in the innermost pid
// namespace, the sandbox's.
func nsPGID(pid int) int {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpgid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

// children lists the children of every thread of pid (/proc/<pid>/task/*/children).
func children(pid int) []int {
	dir := procRoot + "/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// groupWatch collects, from a command's arrival until execd says it started, the
// process groups takeGroups may take: a command that ends within milliseconds (a curl
// refused at once) is gone from /proc by the time execd's init event is read, so
// the host looks while it runs, every watchTick for the first watchFast, then every
// watchSlow, at most WatchMax.
type groupWatch struct {
	initPID int
	since   time.Duration
	stop    chan struct{}
	done    chan struct{}
	found   []int // groups seen, in order; read after done
	taken   bool  // End(true) was called (by one goroutine: the watch's owner)
}

const (
	watchTick = time.Millisecond
	watchFast = 200 * time.Millisecond
	watchSlow = 10 * time.Millisecond
)

// WatchMax is the longest a watch looks: a command whose init event comes later
// names no group.
const WatchMax = 30 * time.Second

// watchGroups starts looking for the groups of initPID's children that started no
// earlier than since (boot time).
func watchGroups(initPID int, since time.Duration) *groupWatch {
	w := &groupWatch{initPID: initPID, since: since, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *groupWatch) run() {
	defer close(w.done)
	seen := map[int]bool{}
	scan := func() {
		for _, g := range scanGroups(w.initPID, w.since) {
			if !seen[g] {
				seen[g] = true
				w.found = append(w.found, g)
			}
		}
	}
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			scan()
			return
		case <-t.C:
			scan()
			switch d := time.Since(start); {
			case d > WatchMax:
				return
			case d > watchFast:
				t.Reset(watchSlow)
			default:
				t.Reset(watchTick)
			}
		}
	}
}

// end stops the watch and returns the groups it saw (nil for a nil watch). Safe to
// call more than once.
func (w *groupWatch) end() []int {
	if w == nil {
		return nil
	}
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return w.found
}

// scanGroups returns the process groups of initPID's children, other than initPID's
// own (the entrypoint's), that have a member started no earlier than since - one
// tick (boot time).
func scanGroups(initPID int, since time.Duration) []int {
	if initPID <= 0 {
		return nil
	}
	seen := map[int]bool{}
	var found []int
	for _, c := range children(initPID) {
		_, pgrp, start, ok := statFields(c)
		if !ok || pgrp == initPID || pgrp <= 0 || seen[pgrp] || start+time.Second/clkTck < since {
			continue
		}
		seen[pgrp] = true
		found = append(found, pgrp)
	}
	return found
}

// takeGroups returns those of found (groups of initPID's children, from scanGroups or
// a groupWatch) that no earlier call took. One group is taken and returned; several
// (commands started together) are returned untaken with ambiguous set.
func takeGroups(initPID int, found []int) (groups []ProcGroup, ambiguous bool) {
	now := time.Now()
	claims.Lock()
	var out []ProcGroup
	for k, at := range claims.m {
		if now.Sub(at) > claimKeep {
			delete(claims.m, k)
		}
	}
	for _, g := range found {
		if _, taken := claims.m[[2]int{initPID, g}]; !taken {
			out = append(out, ProcGroup{PGID: g})
		}
	}
	if len(out) == 1 {
		claims.m[[2]int{initPID, out[0].PGID}] = now
	}
	claims.Unlock()
	for i := range out {
		out[i].NSPGID = nsPGID(out[i].PGID)
	}
	return out, len(out) > 1
}
