package enforcer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/nftfilter"
)

// LockDir is where an egressd holds one lock file per piece of host state it owns: its
// nftables tables (per network namespace) and its eBPF pin root. The lock is an flock
// on an open file, which the kernel releases when the process exits, SIGKILL included:
// a lock nobody holds means the state's owner is dead. Each file holds its owner's pid.
var LockDir = "/run/airlock/egress"

// ErrInUse is returned by ClaimHost when a live egressd holds the tables or the pin
// root: a second installation or test in the same place needs other names
// (nftfilter.Config.Table, the eBPF pin root).
var ErrInUse = errors.New("host state in use by a live egressd")

// pinned is an EBPF backend (ebpf.Config) that says where its state is pinned and how
// many sandboxes that state still enforces.
type pinned interface {
	// PinPath is the bpffs directory of the backend's pinned state.
	PinPath() string
	// PinnedSandboxes counts the sandboxes the pinned state enforces (0 when there is
	// none, -1 when unreadable); it reads pinned maps, loads no program.
	PinnedSandboxes() int
}

// Claim is one process's hold on the host state of a datapath configuration: the
// nftables tables cfg.NFT.Table in cfg.NetNS and the eBPF pin root. Get it with
// ClaimHost before New; Done releases it.
type Claim struct {
	table, netns, pinRoot string
	locks                 []*os.File
	log                   *slog.Logger
}

// ClaimHost locks the host state cfg uses (its nftables tables and its eBPF pin root)
// for this process. It fails with ErrInUse, naming the pid, when a live egressd holds
// either. State found under a free lock was left by a dead process: with no sandbox in
// it (no sandbox chain in the tables, no sandbox in the pinned maps) it is removed, so
// that the new process starts clean; with sandboxes it stays for New to adopt (they
// stay enforced meanwhile; egressd detaches those lifecycle no longer lists). Both are
// logged. When LockDir cannot be created (no /run) the state is not claimed and that is
// logged: egressd runs as before.
func ClaimHost(cfg Config) (*Claim, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Claim{table: cfg.NFT.Table, netns: cfg.NetNS, log: log}
	if c.table == "" {
		c.table = nftfilter.TableName
	}
	if c.netns == "" {
		c.netns = cfg.NFT.NetNS
	}
	if p, ok := cfg.EBPF.(pinned); ok {
		c.pinRoot = p.PinPath()
	}
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		log.Warn("host state not claimed: no lock directory", "dir", LockDir, "err", err)
		return c, nil
	}
	paths := []string{nftLock(c.nsKey(), c.table)}
	if c.pinRoot != "" {
		paths = append(paths, pinLock(c.pinRoot))
	}
	var prev []string
	for _, p := range paths {
		f, pid, err := lock(p)
		if err != nil {
			c.release()
			return nil, err
		}
		c.locks = append(c.locks, f)
		if pid != "" && pid != strconv.Itoa(os.Getpid()) {
			prev = append(prev, pid)
		}
	}
	c.replaceStale(cfg, prev)
	return c, nil
}

// nftLock is the lock file of the tables named table in the namespace nsKey ("" for
// the host's).
func nftLock(nsKey, table string) string {
	return filepath.Join(LockDir, "nft-"+nsKey+table+".lock")
}

// pinLock is the lock file of the eBPF pin root dir.
func pinLock(dir string) string {
	return filepath.Join(LockDir, "bpf-"+strings.ReplaceAll(strings.Trim(filepath.Clean(dir), "/"), "/", "_")+".lock")
}

// lock opens path (creating its directory), takes its flock without waiting and writes
// this process's pid in it. It returns the pid the file held before (its last owner),
// or ErrInUse with the live owner's pid.
func lock(path string) (*os.File, string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, "", err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, "", err
	}
	b, _ := os.ReadFile(path)
	pid := strings.TrimSpace(string(b))
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, "", fmt.Errorf("%w: %s (pid %s)", ErrInUse, path, pid)
		}
		return nil, "", fmt.Errorf("locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, pid, nil
}

// nsKey distinguishes the tables of another network namespace (its inode); "" for
// the caller's.
func (c *Claim) nsKey() string {
	if c.netns == "" {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Stat(c.netns, &st); err != nil {
		return "ns_" + strings.ReplaceAll(strings.Trim(c.netns, "/"), "/", "_") + "-"
	}
	return "ns" + strconv.FormatUint(st.Ino, 10) + "-"
}

// replaceStale handles the state found under free locks (see ClaimHost).
func (c *Claim) replaceStale(cfg Config, prev []string) {
	nftSbx, err := nftfilter.HasSandboxes(c.netns, c.table)
	if err != nil {
		nftSbx = true // unknown: keep
	}
	bpfSbx := 0
	pinFound := false
	if p, ok := cfg.EBPF.(pinned); ok && c.pinRoot != "" {
		if _, err := os.Stat(c.pinRoot); err == nil {
			pinFound = true
			bpfSbx = p.PinnedSandboxes()
		}
	}
	if nftSbx || bpfSbx != 0 { // -1: unreadable, keep
		c.log.Info("adopting host state a previous egressd left; sandboxes lifecycle no longer lists are detached at the first snapshot",
			"previous_pid", strings.Join(prev, ","), "nft_table", c.table, "nft_sandboxes", nftSbx, "pin_root", c.pinRoot, "ebpf_sandboxes", bpfSbx)
		return
	}
	removed := c.remove(pinFound)
	if len(removed) > 0 {
		c.log.Info("removed stale host state a dead egressd left (no sandbox in it)",
			"previous_pid", strings.Join(prev, ","), "removed", strings.Join(removed, "; "))
	}
}

// remove deletes the tables and, with pins, the pin root; it returns what it removed.
func (c *Claim) remove(pins bool) []string {
	var out []string
	fams, err := nftfilter.RemoveTable(c.netns, c.table)
	if err != nil {
		c.log.Warn("removing nftables tables failed", "nft_table", c.table, "err", err)
	}
	for _, f := range fams {
		out = append(out, "nftables table "+f+" "+c.table)
	}
	if pins && c.pinRoot != "" {
		if err := os.RemoveAll(c.pinRoot); err != nil {
			c.log.Warn("removing pinned eBPF state failed", "pin_root", c.pinRoot, "err", err)
		} else {
			out = append(out, "pinned eBPF state "+c.pinRoot)
		}
	}
	return out
}

// Done ends the claim after the datapath was closed. With attached == 0 (no sandbox
// left to enforce, nothing to adopt) it removes the tables and the pin root, so that an
// orderly stop leaves nothing on the host; otherwise it keeps them (the sandboxes stay
// enforced, fail closed, and the next start adopts them). Both are logged. It then
// releases the locks. Without locks (LockDir missing) it does nothing. Safe on a nil
// Claim and more than once.
func (c *Claim) Done(attached int) {
	if c == nil || c.locks == nil { // not claimed (no LockDir): never remove
		return
	}
	if attached == 0 {
		if removed := c.remove(true); len(removed) > 0 {
			c.log.Info("removed host state at stop (no sandbox left to enforce)", "removed", strings.Join(removed, "; "))
		}
		for _, f := range c.locks { // nothing left to own: no lock file left either
			os.Remove(f.Name())
		}
	} else {
		c.log.Info("kept host state at stop: its sandboxes stay enforced until the next start adopts them",
			"nft_table", c.table, "pin_root", c.pinRoot, "sandboxes", attached)
	}
	c.release()
}

func (c *Claim) release() {
	for _, f := range c.locks {
		f.Close()
	}
	c.locks = nil
}
