package enforcer

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/egressd/nftfilter"
)

// BPFDir is the bpffs directory RemoveDead searches for pin roots.
var BPFDir = "/sys/fs/bpf"

// defaultPinRoot is the eBPF backend's default pin root (ebpf.DefaultPinRoot), which
// RemoveDead never removes.
const defaultPinRoot = "airlock"

// RemoveDead removes the nftables tables (inet and netdev, in this host's network
// namespace) and the eBPF pin roots (directories of BPFDir) whose names match one of
// patterns (path.Match syntax, "airlock_t*") and that no live egressd holds: their lock
// in LockDir is free, so the process that made them is dead. It is the cleaner of test
// machines (.ci/run, before the suite): killed test runs leave such state behind. The
// default installation's (table nftfilter.TableName, pin root BPFDir/airlock) is never
// removed here, whatever the patterns: `airlock down --purge` removes it. An egressd
// that never claims its state (tests driving nftfilter or the eBPF backend directly)
// holds no lock: run this only when no such test runs. It returns one line per removal
// and per entry kept because its owner lives; errors are joined, the other entries are
// still handled. A bad pattern is an error before anything is removed. Free lock files
// whose state is gone are removed too (removeOrphanLocks).
func RemoveDead(patterns []string) ([]string, error) {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("pattern %q: %w", p, err)
		}
	}
	match := func(name string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { ok, _ := path.Match(p, name); return ok })
	}
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	var errs []error
	// withLock runs rm when the lock at lockPath is free, then drops the lock file.
	withLock := func(what, lockPath string, rm func() error) {
		f, _, err := lock(lockPath)
		if errors.Is(err, ErrInUse) {
			out = append(out, "kept "+what+": "+err.Error())
			return
		}
		if err != nil {
			errs = append(errs, err)
			return
		}
		defer f.Close()
		if err := rm(); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", what, err))
			return
		}
		os.Remove(lockPath)
		out = append(out, "removed "+what)
	}
	tables, err := nftfilter.Tables("")
	if err != nil {
		errs = append(errs, err)
	}
	for _, t := range tables {
		if t == nftfilter.TableName || !match(t) {
			continue
		}
		withLock("nftables tables "+t, nftLock("", t), func() error {
			_, err := nftfilter.RemoveTable("", t)
			return err
		})
	}
	ents, err := os.ReadDir(BPFDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == defaultPinRoot || !match(e.Name()) {
			continue
		}
		dir := filepath.Join(BPFDir, e.Name())
		withLock("pinned eBPF state "+dir, pinLock(dir), func() error { return os.RemoveAll(dir) })
	}
	if err := removeOrphanLocks(); err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// removeOrphanLocks removes the free lock files of LockDir whose state (a table of the
// host's namespace, a directory of BPFDir) no longer exists: an egressd stopped with
// sandboxes keeps its lock file, and `airlock down --purge` or a test removed the state
// afterwards.
func removeOrphanLocks() error {
	live := map[string]bool{}
	tables, err := nftfilter.Tables("")
	if err != nil {
		return err
	}
	for _, t := range tables {
		live[nftLock("", t)] = true
	}
	ents, _ := os.ReadDir(BPFDir)
	for _, e := range ents {
		live[pinLock(filepath.Join(BPFDir, e.Name()))] = true
	}
	locks, err := os.ReadDir(LockDir)
	if err != nil {
		return err
	}
	for _, e := range locks {
		p := filepath.Join(LockDir, e.Name())
		if live[p] || filepath.Ext(p) != ".lock" || strings.HasPrefix(e.Name(), "nft-ns") {
			continue // state exists, not a lock, or another namespace's (not checked here)
		}
		if f, _, err := lock(p); err == nil {
			os.Remove(p)
			f.Close()
		}
	}
	return nil
}
