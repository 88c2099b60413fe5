// Package systemd installs `airlock up` as a systemd service: the airlock and execd
// binaries under /usr/local, the unit airlock.service (this folder) in
// /etc/systemd/system, then `systemctl daemon-reload` and `systemctl enable --now
// airlock` when systemd runs the host. `airlock up --install-service` calls it;
// deploy/README.md describes the same steps by hand.
package systemd

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed airlock.service
var unitTemplate string

// Where the installed files go (below Installer.Root).
const (
	UnitPath   = "/etc/systemd/system/airlock.service"
	BinaryPath = "/usr/local/bin/airlock"
	// ExecdPath is where `airlock up` looks for execd when it is not beside the binary.
	ExecdPath = "/usr/local/lib/airlock/execd"
	// UnitName is the service's name for systemctl.
	UnitName = "airlock.service"
)

// Unit is the unit file text running binary with `up` and args. Arguments are quoted
// for systemd's command-line syntax (systemd.service(5), "Command lines"): spaces,
// quotes and backslashes inside double quotes, % doubled.
func Unit(binary string, args []string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteByte(' ')
		b.WriteString(quote(a))
	}
	return strings.NewReplacer("@BINARY@", quote(binary), "@ARGS@", b.String()).Replace(unitTemplate)
}

func quote(s string) string {
	s = strings.ReplaceAll(s, "%", "%%")
	if s != "" && !strings.ContainsAny(s, " \t\"'\\;$") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// Installer installs the service. Zero values: Root "/", Systemctl runs the systemctl
// command, Out discards.
type Installer struct {
	// Root prefixes every path written (tests use a temporary directory).
	Root string
	// Binary and Execd are the files to install (the running airlock and its execd).
	Binary, Execd string
	// Args follow `up` in ExecStart (e.g. --config /etc/airlock/airlock.yaml).
	Args []string
	// SystemdRunning reports whether systemd manages this host; nil checks for
	// /run/systemd/system (sd_booted(3)).
	SystemdRunning func() bool
	// Systemctl runs systemctl with args; nil executes the systemctl command.
	Systemctl func(args ...string) error
	// Out receives one line per step.
	Out io.Writer
}

// ErrNoExecd is returned when the execd binary to install does not exist.
var ErrNoExecd = errors.New("systemd: execd not found beside airlock (run make build)")

// Install copies the binaries, writes the unit and, when systemd runs the host, reloads
// it and enables and starts the service. Without systemd it writes the files and says
// how to start the service. Errors name the step that failed.
func (in Installer) Install() error {
	out := in.Out
	if out == nil {
		out = io.Discard
	}
	if _, err := os.Stat(in.Execd); err != nil {
		return fmt.Errorf("%w: %s", ErrNoExecd, in.Execd)
	}
	for _, f := range []struct{ src, dst string }{{in.Binary, BinaryPath}, {in.Execd, ExecdPath}} {
		dst := filepath.Join(in.Root, f.dst)
		if err := copyExecutable(f.src, dst); err != nil {
			return fmt.Errorf("installing %s: %w", f.dst, err)
		}
		fmt.Fprintf(out, "installed %s\n", f.dst)
	}
	unit := filepath.Join(in.Root, UnitPath)
	if err := os.MkdirAll(filepath.Dir(unit), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(unit, []byte(Unit(BinaryPath, in.Args)), 0o644); err != nil {
		return fmt.Errorf("writing the unit: %w", err)
	}
	fmt.Fprintf(out, "wrote %s\n", UnitPath)

	running := in.SystemdRunning
	if running == nil {
		running = func() bool { _, err := os.Stat("/run/systemd/system"); return err == nil }
	}
	if !running() {
		fmt.Fprintf(out, "systemd does not run this host: start Airlock with `%s up`, or on a systemd host `systemctl enable --now airlock`\n", BinaryPath)
		return nil
	}
	systemctl := in.Systemctl
	if systemctl == nil {
		systemctl = func(args ...string) error {
			if b, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(b)))
			}
			return nil
		}
	}
	for _, args := range [][]string{{"daemon-reload"}, {"enable", "--now", UnitName}} {
		if err := systemctl(args...); err != nil {
			return err
		}
		fmt.Fprintf(out, "systemctl %s\n", strings.Join(args, " "))
	}
	fmt.Fprintln(out, "airlock.service is running: journalctl -u airlock -f shows its log, the API key is in /var/lib/airlock/api-key")
	return nil
}

// copyExecutable copies src to dst (mode 0755) through a temporary file and a rename,
// so a running binary at dst is replaced, not overwritten. src == dst is a no-op.
func copyExecutable(src, dst string) error {
	if a, err := filepath.EvalSymlinks(src); err == nil {
		if b, err := filepath.EvalSymlinks(dst); err == nil && a == b {
			return nil
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".airlock-install-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
