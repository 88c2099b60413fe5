package execdaudit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProc writes a /proc with init 100 (its own group) and the given children:
// pid → {pgrp, starttime in ticks}.
func fakeProc(t *testing.T, kids map[int][2]int) string {
	t.Helper()
	claims.Lock()
	claims.m = map[[2]int]time.Time{} // a fresh host: nothing taken
	claims.Unlock()
	root := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var list []string
	for pid, v := range kids {
		list = append(list, fmt.Sprint(pid))
		// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
		// utime stime cutime cstime priority nice threads itrealvalue starttime
		write(filepath.Join(root, fmt.Sprint(pid), "stat"),
			fmt.Sprintf("%d (sh) S 100 %d 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, v[0], v[1]))
		write(filepath.Join(root, fmt.Sprint(v[0]), "status"), fmt.Sprintf("Name:\tsh\nNSpgid:\t%d\t%d\n", v[0], v[0]-90))
	}
	write(filepath.Join(root, "100", "task", "100", "children"), strings.Join(list, " ")+" ")
	write(filepath.Join(root, "100", "task", "101", "children"), "")
	return root
}

// newGroups is one look at /proc, as at a command's init event.
func newGroups(initPID int, since time.Duration) ([]ProcGroup, bool) {
	return takeGroups(initPID, scanGroups(initPID, since))
}

// TestNewGroups: a command's group is the one new group among the init's children
// (not the init's own, not one started before the request), taken once; groups
// started together are returned as candidates and not taken.
func TestNewGroups(t *testing.T) {
	old := procRoot
	t.Cleanup(func() { procRoot = old })
	since := 50 * time.Second // 5000 ticks
	procRoot = fakeProc(t, map[int][2]int{
		200: {200, 5001}, // the command's first process
		201: {200, 5002}, // a background job of it, re-parented to the init
		300: {100, 5003}, // the entrypoint's group
		400: {400, 4000}, // an older command
	})
	got, ambiguous := newGroups(100, since)
	if ambiguous || len(got) != 1 || got[0].PGID != 200 || got[0].NSPGID != 110 {
		t.Fatalf("newGroups = %+v, %v; want group 200 (110 in the sandbox)", got, ambiguous)
	}
	if got, _ := newGroups(100, since); len(got) != 0 {
		t.Errorf("a taken group is returned again: %+v", got)
	}
	procRoot = fakeProc(t, map[int][2]int{500: {500, 6000}, 600: {600, 6001}})
	got, ambiguous = newGroups(100, 60*time.Second)
	if !ambiguous || len(got) != 2 {
		t.Fatalf("two new groups: %+v, %v; want both, ambiguous", got, ambiguous)
	}
	if got, _ := newGroups(100, 60*time.Second); len(got) != 2 {
		t.Errorf("ambiguous groups were taken: %+v", got)
	}
	if got, _ := newGroups(0, since); got != nil {
		t.Errorf("no init pid: %+v", got)
	}
}

// TestGroupWatchSeesEndedCommand: a command whose processes are gone by the time
// execd's init event is read (a curl refused within milliseconds) keeps its group:
// the watch saw it while it ran.
func TestGroupWatchSeesEndedCommand(t *testing.T) {
	old := procRoot
	root := fakeProc(t, map[int][2]int{700: {700, 7001}})
	procRoot = root
	w := watchGroups(100, 70*time.Second)
	t.Cleanup(func() { w.end(); procRoot = old })
	deadline := time.Now().Add(5 * time.Second)
	for {
		// the watch has looked once the first tick has passed; wait for a second one
		time.Sleep(5 * watchTick)
		if time.Now().After(deadline) || len(scanGroups(100, 70*time.Second)) == 1 {
			break
		}
	}
	time.Sleep(20 * watchTick)
	// the command ends: execd reaps it, it leaves the init's children
	if err := os.WriteFile(filepath.Join(root, "100", "task", "100", "children"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := scanGroups(100, 70*time.Second); len(got) != 0 {
		t.Fatalf("one look after the end still sees %v", got)
	}
	got, ambiguous := takeGroups(100, w.end())
	if ambiguous || len(got) != 1 || got[0].PGID != 700 {
		t.Fatalf("groups after the command ended = %+v, %v; want 700", got, ambiguous)
	}
	if again := w.end(); len(again) != 1 {
		t.Errorf("a second end returns %v", again)
	}
}
