package enforcer

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestRemoveDead: of the tables and pin roots matching the patterns, RemoveDead removes
// those whose owner is dead (no lock held) and keeps those a live egressd holds;
// others stay untouched; a second run finds nothing more. The lock directory does not
// exist yet, as on a fresh machine.
func TestRemoveDead(t *testing.T) {
	testenv.NeedBPF(t)
	old := LockDir
	LockDir = filepath.Join(t.TempDir(), "run", "airlock", "egress")
	t.Cleanup(func() { LockDir = old })
	var b [4]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	dead, live, other := "altestdead_"+tag, "altestlive_"+tag, "alother_"+tag
	for _, tab := range []string{dead, live, other} {
		mark, mask := nftfilter.L7MarkFor(tab)
		if err := nftfilter.EnsureL7Redirect(nftfilter.L7Redirect{Table: tab, Port: 15009, Mark: mark, Mask: mask}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nftfilter.RemoveTable("", tab) })
	}
	deadPin, livePin := filepath.Join(BPFDir, dead), filepath.Join(BPFDir, live)
	for _, d := range []string{deadPin, livePin} {
		if err := os.MkdirAll(filepath.Join(d, "maps"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	// The live one: claimed as egressd claims (ClaimHost), with a sandbox-free state it
	// would replace, so claim it through the locks only.
	var held []*os.File
	for _, p := range []string{nftLock("", live), pinLock(livePin)} {
		f, _, err := lock(p)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
	}
	t.Cleanup(func() {
		for _, f := range held {
			f.Close()
			os.Remove(f.Name())
		}
	})
	orphan := nftLock("", "altestgone_"+tag) // its state is gone: the lock file goes too
	if err := os.WriteFile(orphan, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := RemoveDead([]string{"altestdead_*", "altestlive_*"})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(out, "\n")
	for _, want := range []string{"removed nftables tables " + dead, "removed pinned eBPF state " + deadPin, "kept nftables tables " + live, "kept pinned eBPF state " + livePin} {
		if !strings.Contains(got, want) {
			t.Errorf("RemoveDead said:\n%s\nwant a line %q", got, want)
		}
	}
	tables, err := nftfilter.Tables("")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(tables, dead) || !slices.Contains(tables, live) || !slices.Contains(tables, other) {
		t.Errorf("tables after RemoveDead: %v (want %s gone, %s and %s kept)", tables, dead, live, other)
	}
	if _, err := os.Stat(deadPin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead pin root %s: %v, want removed", deadPin, err)
	}
	if _, err := os.Stat(livePin); err != nil {
		t.Errorf("live pin root %s: %v, want kept", livePin, err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan lock file %s: %v, want removed", orphan, err)
	}
	for _, f := range held {
		if _, err := os.Stat(f.Name()); err != nil {
			t.Errorf("the live egressd's lock file %s: %v, want kept", f.Name(), err)
		}
	}
	if out, err := RemoveDead([]string{"altestdead_*"}); err != nil || len(out) != 0 {
		t.Errorf("second run: %v %v, want nothing", out, err)
	}
	if _, err := RemoveDead([]string{"["}); err == nil {
		t.Error("a bad pattern was accepted")
	}
}
