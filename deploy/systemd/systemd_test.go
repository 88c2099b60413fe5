package systemd

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// parseUnit reads a unit file into section -> key -> values.
func parseUnit(t *testing.T, text string) map[string]map[string][]string {
	t.Helper()
	units := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			units[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("unit line %q is not key=value in a section", line)
			}
			units[section][k] = append(units[section][k], v)
		}
	}
	return units
}

func TestUnit(t *testing.T) {
	u := parseUnit(t, Unit("/usr/local/bin/airlock", []string{"--config", "/etc/airlock/my config.yaml", "--log-level=100%"}))
	want := map[string]map[string]string{
		"Service": {
			"ExecStart":        `/usr/local/bin/airlock up --config "/etc/airlock/my config.yaml" --log-level=100%%`,
			"Restart":          "on-failure",
			"StateDirectory":   "airlock",
			"StandardOutput":   "journal",
			"StandardError":    "journal",
			"SyslogIdentifier": "airlock",
		},
		"Unit":    {"After": "network-online.target docker.service containerd.service"},
		"Install": {"WantedBy": "multi-user.target"},
	}
	for section, keys := range want {
		for k, v := range keys {
			if got := u[section][k]; !slices.Equal(got, []string{v}) {
				t.Errorf("[%s] %s = %q, want %q", section, k, got, v)
			}
		}
	}
}

func fakeBinaries(t *testing.T) (airlock, execd string) {
	t.Helper()
	dir := t.TempDir()
	airlock, execd = filepath.Join(dir, "airlock"), filepath.Join(dir, "execd")
	if err := os.WriteFile(airlock, []byte("airlock-binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(execd, []byte("execd-binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	return airlock, execd
}

func TestInstallWithSystemd(t *testing.T) {
	airlock, execd := fakeBinaries(t)
	root := t.TempDir()
	var calls []string
	err := Installer{
		Root: root, Binary: airlock, Execd: execd, Args: []string{"--config", "/etc/airlock/airlock.yaml"},
		SystemdRunning: func() bool { return true },
		Systemctl:      func(args ...string) error { calls = append(calls, strings.Join(args, " ")); return nil },
	}.Install()
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{BinaryPath: "airlock-binary", ExecdPath: "execd-binary"} {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Fatalf("%s not installed: %v", path, err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v, want 0755", path, fi.Mode().Perm())
		}
		if b, _ := os.ReadFile(filepath.Join(root, path)); string(b) != content {
			t.Errorf("%s holds %q, want %q", path, b, content)
		}
	}
	unit, err := os.ReadFile(filepath.Join(root, UnitPath))
	if err != nil {
		t.Fatal(err)
	}
	if got := parseUnit(t, string(unit))["Service"]["ExecStart"]; !slices.Equal(got, []string{BinaryPath + " up --config /etc/airlock/airlock.yaml"}) {
		t.Errorf("ExecStart %q", got)
	}
	if want := []string{"daemon-reload", "enable --now airlock.service"}; !slices.Equal(calls, want) {
		t.Errorf("systemctl calls %q, want %q", calls, want)
	}
}

func TestInstallWithoutSystemd(t *testing.T) {
	airlock, execd := fakeBinaries(t)
	root := t.TempDir()
	var out strings.Builder
	err := Installer{
		Root: root, Binary: airlock, Execd: execd, Out: &out,
		SystemdRunning: func() bool { return false },
		Systemctl:      func(args ...string) error { t.Errorf("systemctl %q called without systemd", args); return nil },
	}.Install()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, UnitPath)); err != nil {
		t.Errorf("unit not written: %v", err)
	}
	if !strings.Contains(out.String(), "systemd does not run this host") {
		t.Errorf("no explanation printed: %q", out.String())
	}
}

func TestInstallErrors(t *testing.T) {
	airlock, execd := fakeBinaries(t)
	err := Installer{Root: t.TempDir(), Binary: airlock, Execd: execd + ".missing"}.Install()
	if !errors.Is(err, ErrNoExecd) {
		t.Errorf("missing execd: err %v, want ErrNoExecd", err)
	}
	boom := errors.New("unit airlock.service failed")
	err = Installer{
		Root: t.TempDir(), Binary: airlock, Execd: execd,
		SystemdRunning: func() bool { return true },
		Systemctl: func(args ...string) error {
			if args[0] == "enable" {
				return boom
			}
			return nil
		},
	}.Install()
	if !errors.Is(err, boom) {
		t.Errorf("systemctl failure: err %v, want it passed on", err)
	}
}

// TestInstallOverRunningBinary replaces the installed binary by rename, so a running
// copy is not overwritten in place, and installing the installed binary is a no-op.
func TestInstallOverRunningBinary(t *testing.T) {
	airlock, execd := fakeBinaries(t)
	root := t.TempDir()
	in := Installer{Root: root, Binary: airlock, Execd: execd, SystemdRunning: func() bool { return false }}
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(root, BinaryPath)
	before, _ := os.Stat(installed)
	in.Binary = installed
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(installed)
	if !os.SameFile(before, after) {
		t.Error("installing the installed binary replaced it")
	}
	if b, _ := os.ReadFile(installed); string(b) != "airlock-binary" {
		t.Errorf("installed binary holds %q", b)
	}
}
