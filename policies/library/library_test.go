package library

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// memStore is a Store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string]Stored
}

func (s *memStore) LibraryVersions() (map[string]Stored, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Stored{}
	for k, v := range s.m {
		out[k] = v
	}
	return out, nil
}

func (s *memStore) PutLibraryVersion(name string, st Stored) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]Stored{}
	}
	s.m[name] = st
	return nil
}

// events collects Events.
type events struct {
	mu  sync.Mutex
	got []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	e.got = append(e.got, ev)
	e.mu.Unlock()
}

func (e *events) take() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.got
	e.got = nil
	return out
}

const (
	pypi = "defaultAction: deny\negress:\n  - action: allow\n    target: pypi.org\n"
	gh   = "defaultAction: deny\negress:\n  - action: allow\n    target: github.com\n"
	bad  = "defaultAction: deny\negress:\n  - action: allow\n    target: \"foo.*.com\"\n"
)

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	// Like an editor: write a temporary file, then rename it over the old one.
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// TestLibraryVersionsAndRejects: files load with version 1; a change is version 2; a
// broken file is rejected with file:line:col and the version in force stays; a restart
// on the same store keeps versions and, for a file broken while stopped, the stored
// version; a removed file keeps its last version, marked removed.
func TestLibraryVersionsAndRejects(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "python-packages.yaml", pypi)
	write(t, dir, "github.yml", gh)
	write(t, dir, "Not_A_Name.yaml", gh)
	write(t, dir, "notes.txt", "ignored")
	st := &memStore{}
	var ev events
	l, err := Open(Config{Dir: dir, Store: st, OnEvent: ev.add})
	if err != nil {
		t.Fatal(err)
	}
	if names := len(l.List()); names != 2 {
		t.Fatalf("%d policies: %+v", names, l.List())
	}
	p, ok := l.Get("python-packages")
	if !ok || p.Version != 1 || p.Policy.Egress[0].Target != "pypi.org" || len(p.SHA256) != 64 {
		t.Fatalf("python-packages: %+v", p)
	}
	if got := ev.take(); len(got) != 2 || !got[0].Applied || !got[1].Applied {
		t.Fatalf("events at open: %+v", got)
	}

	write(t, dir, "python-packages.yaml", pypi+"  - action: allow\n    target: files.pythonhosted.org\n")
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	if p, _ := l.Get("python-packages"); p.Version != 2 || len(p.Policy.Egress) != 2 {
		t.Fatalf("after change: %+v", p)
	}
	ev.take()

	write(t, dir, "python-packages.yaml", bad)
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	got := ev.take()
	if len(got) != 1 || !got[0].Rejected || got[0].Policy.Version != 2 {
		t.Fatalf("events for a broken file: %+v", got)
	}
	if msg := got[0].Err.Error(); !strings.Contains(msg, filepath.Join(dir, "python-packages.yaml")+":4:") {
		t.Errorf("reject reason %q lacks file:line:col", msg)
	}
	if p, _ := l.Get("python-packages"); p.Version != 2 || len(p.Policy.Egress) != 2 {
		t.Fatalf("a broken file changed the policy in force: %+v", p)
	}

	// Restart: the broken file is still there; the stored version 2 is in force.
	l2, err := Open(Config{Dir: dir, Store: st, OnEvent: ev.add})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := l2.Get("python-packages"); p.Version != 2 || p.Removed || len(p.Policy.Egress) != 2 {
		t.Fatalf("after restart with a broken file: %+v", p)
	}
	if p, _ := l2.Get("github"); p.Version != 1 {
		t.Fatalf("github after restart: %+v", p)
	}
	ev.take()

	if err := os.Remove(filepath.Join(dir, "github.yml")); err != nil {
		t.Fatal(err)
	}
	if err := l2.Reload(); err != nil {
		t.Fatal(err)
	}
	if p, ok := l2.Get("github"); !ok || !p.Removed || p.Version != 1 {
		t.Fatalf("removed file: %+v %v", p, ok)
	}
	if got := ev.take(); len(got) != 1 || !got[0].Removed {
		t.Fatalf("events for a removal: %+v", got)
	}
}

// TestLibraryWatch: Run reloads after a change in the directory (debounced: an editor's
// several writes give one new version).
func TestLibraryWatch(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "p.yaml", pypi)
	var ev events
	l, err := Open(Config{Dir: dir, OnEvent: ev.add, Debounce: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ev.take()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(50 * time.Millisecond) // the watch is in place
	write(t, dir, "p.yaml", gh)
	write(t, dir, "p.yaml", gh+"  - action: allow\n    target: api.github.com\n")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if p, _ := l.Get("p"); len(p.Policy.Egress) == 2 {
			if p.Version != 2 {
				t.Errorf("a burst of writes gave version %d, want 2 (debounced)", p.Version)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change was not picked up within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
