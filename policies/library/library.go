// Package library is the operator's library of named egress policies: one YAML (or
// JSON) policy document per file in a directory (airlock.yaml policies.dir, default
// /etc/airlock/policies), named by the file name without its extension
// (python-packages.yaml is "python-packages").
//
// Files are loaded at Open and reloaded on change (fsnotify on the directory, debounced).
// A file that does not parse is rejected whole with policies.Parse's
// "file:line:col: reason"; the previous version of that policy stays in force, also
// across restarts, because every applied version (number, SHA-256 of the file, source)
// is kept in a Store. A removed file keeps its last version for the sandboxes that use
// it and cannot be named by new ones.
package library

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/airlockdev/airlock/policies"
)

// DefaultDir is where airlock up looks for named policies.
const DefaultDir = "/etc/airlock/policies"

// DefaultDebounce is how long the library waits after the last change in the
// directory before it reloads (editors write a file in several steps).
const DefaultDebounce = 20 * time.Millisecond

// nameRe is what a policy name may be: a DNS label, so it fits in labels and URLs.
var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName reports whether name can name a policy.
func ValidName(name string) bool { return nameRe.MatchString(name) }

// Policy is one version of a named policy.
type Policy struct {
	Name string `json:"name"`
	// Version starts at 1 and increases with every applied change of the file.
	Version uint64 `json:"version"`
	// SHA256 is the hex SHA-256 of the file's bytes.
	SHA256 string `json:"sha256"`
	// File is the path it was loaded from.
	File string `json:"file"`
	// Source is the file's content.
	Source []byte `json:"-"`
	// Removed is set when the file is gone: the version stays for the sandboxes that
	// use it, new ones cannot name it.
	Removed bool `json:"removed,omitempty"`
	// Policy is the parsed document.
	Policy *policies.Policy `json:"-"`
}

// Stored is what a Store keeps of a policy's last applied version.
type Stored struct {
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	File    string `json:"file"`
	Source  []byte `json:"source"`
}

// Store persists the last applied version of each policy (lifecycle's store does).
type Store interface {
	LibraryVersions() (map[string]Stored, error)
	PutLibraryVersion(name string, s Stored) error
}

// Event is what a (re)load did to one policy.
type Event struct {
	// Applied is set for a new version in force (Policy is it).
	Applied bool
	// Rejected is set for a file that did not parse; Err says why (file:line:col:
	// reason) and Policy is the version that stays in force (zero when none).
	Rejected bool
	// Removed is set for a file that went away (Policy is its last version).
	Removed bool
	Name    string
	File    string
	Err     error
	Policy  Policy
}

// Config configures a Library.
type Config struct {
	// Dir holds the policy files; a missing directory is an empty library.
	Dir string
	// Store keeps versions across restarts; nil keeps them in memory only.
	Store Store
	// Debounce is the quiet time before a reload; default DefaultDebounce.
	Debounce time.Duration
	// OnEvent is called, outside any lock of the library, for every applied, rejected
	// or removed policy (lifecycle republishes the sandboxes that use it; airlock up
	// audits it).
	OnEvent func(Event)
	Log     *slog.Logger
}

// Library holds the current version of every named policy. It is safe for concurrent
// use.
type Library struct {
	cfg Config
	log *slog.Logger

	mu       sync.RWMutex
	byName   map[string]Policy
	reloadMu sync.Mutex // one reload at a time
	// rejected is the SHA-256 of each file last rejected, so that an unchanged broken
	// file is reported once, not at every reload. Guarded by reloadMu.
	rejected map[string]string
}

// Open loads the directory. Invalid files are rejected (an Event each) but do not fail
// Open; a Store error does.
func Open(cfg Config) (*Library, error) {
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Library{cfg: cfg, log: cfg.Log, byName: map[string]Policy{}, rejected: map[string]string{}}
	if cfg.Store != nil {
		stored, err := cfg.Store.LibraryVersions()
		if err != nil {
			return nil, fmt.Errorf("policy library: %w", err)
		}
		for name, s := range stored {
			p, err := policies.Parse(s.File, s.Source)
			if err != nil { // written by an older Airlock with other rules: drop it
				l.log.Warn("stored named policy no longer parses; dropped", "policy", name, "err", err)
				continue
			}
			// Removed until the directory shows its file again.
			l.byName[name] = Policy{Name: name, Version: s.Version, SHA256: s.SHA256, File: s.File, Source: s.Source, Policy: p, Removed: true}
		}
	}
	if err := l.Reload(); err != nil {
		return nil, err
	}
	return l, nil
}

// Get returns the current version of name (also when its file was removed).
func (l *Library) Get(name string) (Policy, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p, ok := l.byName[name]
	return p, ok
}

// List returns every policy, by name.
func (l *Library) List() []Policy {
	l.mu.RLock()
	out := make([]Policy, 0, len(l.byName))
	for _, p := range l.byName {
		out = append(out, p)
	}
	l.mu.RUnlock()
	slices.SortFunc(out, func(a, b Policy) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Dir is the library's directory.
func (l *Library) Dir() string { return l.cfg.Dir }

// Reload reads the directory again and applies what changed. Only a Store failure is
// returned; file problems are Events.
func (l *Library) Reload() error {
	l.reloadMu.Lock()
	defer l.reloadMu.Unlock()
	files, err := l.files()
	if err != nil {
		return err
	}
	var events []Event
	var storeErr error
	seen := map[string]bool{}
	for name, file := range files {
		seen[name] = true
		data, err := os.ReadFile(file)
		if err != nil {
			events = append(events, l.reject(name, file, err))
			continue
		}
		sum := sha256.Sum256(data)
		hash := hex.EncodeToString(sum[:])
		cur, had := l.Get(name)
		if had && cur.SHA256 == hash {
			if cur.Removed || cur.File != file {
				l.set(Policy{Name: name, Version: cur.Version, SHA256: hash, File: file, Source: cur.Source, Policy: cur.Policy})
			}
			continue
		}
		if l.rejected[name] == hash {
			continue // reported when it was written
		}
		p, err := policies.Parse(file, data)
		if err != nil {
			l.rejected[name] = hash
			events = append(events, l.reject(name, file, err))
			continue
		}
		delete(l.rejected, name)
		next := Policy{Name: name, Version: cur.Version + 1, SHA256: hash, File: file, Source: data, Policy: p}
		if l.cfg.Store != nil {
			if err := l.cfg.Store.PutLibraryVersion(name, Stored{Version: next.Version, SHA256: hash, File: file, Source: data}); err != nil {
				storeErr = errors.Join(storeErr, fmt.Errorf("policy library: storing %s: %w", name, err))
				continue
			}
		}
		l.set(next)
		l.log.Info("named policy applied", "policy", name, "version", next.Version, "sha256", hash, "file", file)
		events = append(events, Event{Applied: true, Name: name, File: file, Policy: next})
	}
	for _, p := range l.List() {
		if !seen[p.Name] && !p.Removed {
			p.Removed = true
			l.set(p)
			l.log.Warn("named policy file removed; sandboxes that use it keep its last version", "policy", p.Name, "version", p.Version)
			events = append(events, Event{Removed: true, Name: p.Name, File: p.File, Policy: p})
		}
	}
	for _, ev := range events {
		if l.cfg.OnEvent != nil {
			l.cfg.OnEvent(ev)
		}
	}
	return storeErr
}

func (l *Library) set(p Policy) {
	l.mu.Lock()
	l.byName[p.Name] = p
	l.mu.Unlock()
}

func (l *Library) reject(name, file string, err error) Event {
	cur, had := l.Get(name)
	if had && cur.Removed { // its file is back, if broken: the stored version is in force
		cur.Removed, cur.File = false, file
		l.set(cur)
	}
	l.log.Error("named policy rejected; the previous version stays in force", "policy", name, "file", file,
		"version_in_force", cur.Version, "err", err)
	return Event{Rejected: true, Name: name, File: file, Err: err, Policy: cur}
}

// files maps policy names to the files of the directory (*.yaml, *.yml, *.json; hidden
// and editor temporary files are ignored). Two files for one name: the first in
// lexical order wins and the other is an error event at reload.
func (l *Library) files() (map[string]string, error) {
	out := map[string]string{}
	if l.cfg.Dir == "" {
		return out, nil
	}
	ents, err := os.ReadDir(l.cfg.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy library: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		if e.IsDir() || strings.HasPrefix(n, ".") || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		name := strings.TrimSuffix(n, ext)
		if !ValidName(name) {
			l.log.Warn("policy file ignored: its name is not a valid policy name (lowercase letters, digits, '-')", "file", n)
			continue
		}
		if _, dup := out[name]; dup {
			l.log.Warn("policy file ignored: another file has the same name", "file", n, "kept", out[name])
			continue
		}
		out[name] = filepath.Join(l.cfg.Dir, n)
	}
	return out, nil
}

// Run watches the directory and reloads after every burst of changes until ctx ends.
// Without a directory configured it only waits for ctx; a configured one that does not
// exist yet is watched from when it appears.
func (l *Library) Run(ctx context.Context) error {
	if l.cfg.Dir == "" {
		<-ctx.Done()
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy library: %w", err)
	}
	defer w.Close()
	// A directory that does not exist yet is waited for (checked every second), not
	// created: the library is empty until the operator makes it.
	for {
		if _, err := os.Stat(l.cfg.Dir); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	if err := w.Add(l.cfg.Dir); err != nil {
		return fmt.Errorf("policy library: watching %s: %w", l.cfg.Dir, err)
	}
	// A change between Open and Add would be missed: reload once now.
	if err := l.Reload(); err != nil {
		l.log.Error("policy library reload failed", "err", err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op&(fsnotify.Create|fsnotify.Write|fsnotify.Remove|fsnotify.Rename) != 0 {
				timer.Reset(l.cfg.Debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			l.log.Warn("policy library watch error; reloading", "err", err)
			timer.Reset(l.cfg.Debounce)
		case <-timer.C:
			if err := l.Reload(); err != nil {
				l.log.Error("policy library reload failed", "err", err)
			}
		}
	}
}
