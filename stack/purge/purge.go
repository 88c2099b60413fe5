// Package purge stops a running `airlock up` on this host and removes what it made:
// `airlock down` and `airlock down --purge`. Removal is scoped to one installation:
// the containers carrying its instance id (from its store), its Docker network, the
// execd template images no container uses, its pinned eBPF state, the nftables table
// and its state directory. The audit log is kept unless asked for. Every step says what it removed; a second run finds nothing.
package purge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/lifecycle/docker"
)

// PIDFile is the name, in the state directory, of the file holding a running
// `airlock up`'s process id.
const PIDFile = "airlock.pid"

// Config says which installation to stop and purge.
type Config struct {
	// StateDir holds the store, the keys and PIDFile.
	StateDir string
	// AuditDir is the audit log, kept unless PurgeAudit.
	AuditDir string
	// AuditKeys are the files of the audit log's signing key pair that the stack
	// generated (<audit dir>.key and .pub): kept with the audit log, so that it can
	// still be verified, and removed with it.
	AuditKeys []string
	// Network is the Docker network; PinRoot the bpffs directory of the eBPF state.
	Network, PinRoot string
	// NFTNetNS is the network namespace (path) whose inet and netdev NFTTable tables
	// are removed; empty: this host's.
	NFTNetNS string
	// NFTTable names those tables; empty: nftfilter.TableName.
	NFTTable string
	// PurgeAudit removes the audit log too.
	PurgeAudit bool
	// StopTimeout bounds the wait after SIGTERM before SIGKILL; default 25 s.
	StopTimeout time.Duration
	// Systemd reports whether airlock.service is active and stops it; nil: systemctl
	// when systemd runs the host.
	Systemd Systemd
	// Out receives one line per step.
	Out io.Writer
}

// Systemd is the service manager, as down uses it.
type Systemd interface {
	Active() bool
	Stop() error
}

// Stop stops a running `airlock up`: airlock.service when systemd runs it, else the
// process named in the state directory's PIDFile (SIGTERM, then SIGKILL after
// StopTimeout). It reports whether something was running.
func Stop(ctx context.Context, cfg Config) (bool, error) {
	cfg.defaults()
	if cfg.Systemd.Active() {
		fmt.Fprintln(cfg.Out, "stopping airlock.service (systemctl stop airlock)")
		if err := cfg.Systemd.Stop(); err != nil {
			return true, err
		}
		fmt.Fprintln(cfg.Out, "stopped airlock.service")
		return true, nil
	}
	pid, ok := runningPID(filepath.Join(cfg.StateDir, PIDFile))
	if !ok {
		return false, nil
	}
	fmt.Fprintf(cfg.Out, "stopping airlock up (pid %d, SIGTERM)\n", pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return true, fmt.Errorf("signalling pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(cfg.StopTimeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			fmt.Fprintf(cfg.Out, "pid %d still running after %s: SIGKILL\n", pid, cfg.StopTimeout)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for i := 0; i < 50 && alive(pid); i++ {
				time.Sleep(100 * time.Millisecond)
			}
			break
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if alive(pid) {
		return true, fmt.Errorf("airlock up (pid %d) did not exit", pid)
	}
	fmt.Fprintf(cfg.Out, "stopped airlock up (pid %d)\n", pid)
	return true, nil
}

// Purge removes what the installation made (see the package comment). Call it after
// Stop. Errors of the steps are joined; the steps that can run still run.
func Purge(ctx context.Context, cfg Config, cli *client.Client) error {
	cfg.defaults()
	var errs []error
	n := 0
	step := func(removed int, err error) {
		n += removed
		if err != nil {
			errs = append(errs, err)
		}
	}
	step(removeContainers(ctx, cfg, cli))
	step(removeNetwork(ctx, cfg, cli))
	step(removeTemplates(ctx, cfg, cli))
	step(removePins(cfg))
	step(removeTable(cfg))
	step(removeState(cfg))
	if n == 0 && len(errs) == 0 {
		fmt.Fprintln(cfg.Out, "nothing to remove")
	}
	if !cfg.PurgeAudit {
		if _, err := os.Stat(cfg.AuditDir); err == nil {
			fmt.Fprintf(cfg.Out, "kept the audit log %s and its signing key (--purge-audit removes them)\n", cfg.AuditDir)
		}
	}
	return errors.Join(errs...)
}

func (c *Config) defaults() {
	if c.StopTimeout <= 0 {
		c.StopTimeout = 25 * time.Second
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.NFTTable == "" {
		c.NFTTable = nftfilter.TableName
	}
	if c.Systemd == nil {
		c.Systemd = systemctl{}
	}
}

// runningPID reads path and returns the pid when that process is alive and is an
// airlock binary (a stale file of a crashed run, or a reused pid, is ignored).
func runningPID(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0, false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(strings.TrimSuffix(exe, " (deleted)")), "airlock") {
		return 0, false
	}
	return pid, true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

// removeContainers removes the containers of the store's instance, or, without a
// store, the Airlock containers on the network.
func removeContainers(ctx context.Context, cfg Config, cli *client.Client) (int, error) {
	filters := client.Filters{}
	db := filepath.Join(cfg.StateDir, "lifecycle.db")
	if _, err := os.Stat(db); err == nil {
		st, err := boltstore.Open(db)
		if err != nil {
			return 0, fmt.Errorf("reading the instance id: %w", err)
		}
		inst, err := st.InstanceID()
		st.Close()
		if err != nil {
			return 0, err
		}
		filters = filters.Add("label", docker.LabelInstance+"="+inst)
	} else {
		filters = filters.Add("label", docker.LabelManagedBy).Add("network", cfg.Network)
	}
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: filters})
	if err != nil {
		return 0, fmt.Errorf("listing containers: %w", err)
	}
	n := 0
	var errs []error
	for _, c := range res.Items {
		_, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("removing container %.12s: %w", c.ID, err))
			continue
		}
		n++
		fmt.Fprintf(cfg.Out, "removed container %.12s (sandbox %s)\n", c.ID, c.Labels[docker.LabelSandboxID])
	}
	return n, errors.Join(errs...)
}

// removeTemplates removes the execd template images (lifecycle/docker) that no
// container uses; another installation's sandboxes keep theirs.
func removeTemplates(ctx context.Context, cfg Config, cli *client.Client) (int, error) {
	res, err := cli.ImageList(ctx, client.ImageListOptions{Filters: client.Filters{}.Add("label", docker.LabelTemplate)})
	if err != nil {
		return 0, fmt.Errorf("listing execd template images: %w", err)
	}
	n := 0
	for _, img := range res.Items {
		for _, tag := range docker.TemplateTags(img.Labels, img.RepoTags) { // never a snapshot
			if _, err := cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{}); err == nil {
				n++
				fmt.Fprintf(cfg.Out, "removed image %s\n", tag)
			} else if !cerrdefs.IsNotFound(err) {
				fmt.Fprintf(cfg.Out, "kept image %s (in use)\n", tag)
			}
		}
	}
	return n, nil
}

func removeNetwork(ctx context.Context, cfg Config, cli *client.Client) (int, error) {
	if _, err := cli.NetworkInspect(ctx, cfg.Network, client.NetworkInspectOptions{}); cerrdefs.IsNotFound(err) {
		return 0, nil
	}
	if _, err := cli.NetworkRemove(ctx, cfg.Network, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return 0, fmt.Errorf("removing network %s (containers of another installation on it?): %w", cfg.Network, err)
	}
	fmt.Fprintf(cfg.Out, "removed network %s\n", cfg.Network)
	return 1, nil
}

// removePins unpins the eBPF programs, links and maps: with no process holding them
// the kernel detaches the links and frees the maps.
func removePins(cfg Config) (int, error) {
	if _, err := os.Stat(cfg.PinRoot); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err := os.RemoveAll(cfg.PinRoot); err != nil {
		return 0, fmt.Errorf("removing pinned eBPF state %s: %w", cfg.PinRoot, err)
	}
	fmt.Fprintf(cfg.Out, "removed pinned eBPF state %s\n", cfg.PinRoot)
	return 1, nil
}

func removeTable(cfg Config) (int, error) {
	removed, err := nftfilter.RemoveTable(cfg.NFTNetNS, cfg.NFTTable)
	for _, fam := range removed {
		fmt.Fprintf(cfg.Out, "removed nftables table %s %s\n", fam, cfg.NFTTable)
	}
	return len(removed), err
}

// removeState removes the state directory's entries (store, keys, pid file), the
// audit log only with PurgeAudit, and the directory itself once empty.
func removeState(cfg Config) (int, error) {
	n := 0
	var errs []error
	rm := func(p string) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			return
		}
		n++
		fmt.Fprintf(cfg.Out, "removed %s\n", p)
	}
	kept := map[string]bool{}
	for _, p := range append([]string{cfg.AuditDir}, cfg.AuditKeys...) {
		a, _ := filepath.Abs(p)
		kept[a] = true
	}
	entries, err := os.ReadDir(cfg.StateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	for _, e := range entries {
		p, _ := filepath.Abs(filepath.Join(cfg.StateDir, e.Name()))
		if kept[p] {
			continue
		}
		rm(p)
	}
	if cfg.PurgeAudit {
		for _, p := range append([]string{cfg.AuditDir}, cfg.AuditKeys...) {
			if _, err := os.Stat(p); err == nil {
				rm(p)
			}
		}
	}
	if err == nil {
		if rest, _ := os.ReadDir(cfg.StateDir); len(rest) == 0 {
			if os.Remove(cfg.StateDir) == nil {
				fmt.Fprintf(cfg.Out, "removed %s\n", cfg.StateDir)
			}
		}
	}
	return n, errors.Join(errs...)
}
