package ebpf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	bpf "github.com/cilium/ebpf"
)

// Pinned state outlives the process, so a new build may find maps pinned by an older
// one. Maps of an array-of-maps type keep their inner maps' old layout, which the
// kernel only reports as a verifier error when the new programs load. A marker pinned
// beside the maps (maps/layout_<fingerprint>) names the layout that pinned them.

const layoutPrefix = "layout_"

// layoutFingerprint hashes what the pinned maps' compatibility depends on: each map's
// name, type, key and value sizes, capacity and flags, and its inner map's.
func layoutFingerprint(spec *bpf.CollectionSpec) string {
	names := make([]string, 0, len(spec.Maps))
	for n := range spec.Maps {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		m := spec.Maps[n]
		if m.Pinning != bpf.PinByName {
			continue
		}
		fmt.Fprintf(h, "%s %s %d %d %d %d;", n, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags)
		if in := m.InnerMap; in != nil {
			fmt.Fprintf(h, "inner %s %d %d %d %d;", in.Type, in.KeySize, in.ValueSize, in.MaxEntries, in.Flags)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// checkLayout compares the state pinned under root with fp. State of another layout
// with no sandbox attached is removed (nothing is enforced by it); with sandboxes
// attached it is an error, because removing it would leave them unfiltered.
func checkLayout(root, fp string, log interface{ Warn(string, ...any) }) error {
	dir := filepath.Join(root, "maps")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) == 0 || slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == layoutPrefix+fp }) {
		return nil
	}
	attached := 0
	if m, err := bpf.LoadPinnedMap(filepath.Join(dir, "cfg_by_ifindex"), nil); err == nil {
		k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		for it := m.Iterate(); it.Next(k, v); {
			attached++
		}
		m.Close()
	}
	if attached > 0 {
		return fmt.Errorf("pinned eBPF state under %s is from an incompatible build and still enforces %d sandbox(es): "+
			"stop them (or detach them with the build that attached them) before starting this one", root, attached)
	}
	log.Warn("removing pinned eBPF state of an incompatible build (no sandbox attached)", "pin_root", root)
	for _, sub := range []string{"links", "progs", "maps", "learned"} {
		if err := os.RemoveAll(filepath.Join(root, sub)); err != nil {
			return fmt.Errorf("remove stale pinned state: %w", err)
		}
	}
	return os.MkdirAll(dir, 0o700)
}

// pinLayout pins the marker of fp (a one-element array) and removes other markers.
func pinLayout(root, fp string) error {
	dir := filepath.Join(root, "maps")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), layoutPrefix) && e.Name() != layoutPrefix+fp {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	path := filepath.Join(dir, layoutPrefix+fp)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	m, err := bpf.NewMap(&bpf.MapSpec{Name: "airlock_layout", Type: bpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("layout marker: %w", err)
	}
	defer m.Close()
	if err := m.Pin(path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("pin layout marker: %w", err)
	}
	return nil
}

// pinnedSandboxes counts the entries of the cfg_by_ifindex map pinned under root (one
// per attached sandbox); 0 when it is not there, -1 when it cannot be read.
func pinnedSandboxes(root string) int {
	m, err := bpf.LoadPinnedMap(filepath.Join(root, "maps", "cfg_by_ifindex"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		return -1
	}
	defer m.Close()
	n := 0
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	for it := m.Iterate(); it.Next(k, v); {
		n++
	}
	return n
}
