// Package host tests deploy/host/prepare.sh's decisions against fake hosts: a PATH of
// stubs, a fake file tree, a fake mount table and a fake engine socket. The warm machine
// the tests run on cannot hide a missing install step, because the script sees only what
// each test puts there.
package host

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/testenv"
)

// probes is every probe prepare.sh makes and the package it installs when the probe
// fails. A probe starting with / is a file; the others are commands on the PATH.
var probes = map[string]string{
	"dockerd":                        "docker.io",
	"containerd":                     "containerd",
	"runc":                           "runc",
	"runsc":                          "runsc",
	"docker":                         "docker.io",
	"curl":                           "curl",
	"debootstrap":                    "debootstrap",
	"chroot":                         "coreutils",
	"tar":                            "tar",
	"clang":                          "clang",
	"llvm-strip":                     "llvm",
	"/usr/include/bpf/bpf_helpers.h": "libbpf-dev",
	"ip":                             "iproute2",
	"openssl":                        "openssl",
	"git":                            "git",
	"gcc":                            "gcc",
	"chromium":                       "chromium",
	"/usr/lib/cni/bridge":            "containernetworking-plugins",
	"nft":                            "nftables",
	"ipset":                          "ipset",
	"node":                           "nodejs",
	"npm":                            "npm",
}

// fakeHost is a host for one run of prepare.sh --plan.
type fakeHost struct {
	bin    string // the whole PATH
	root   string // AIRLOCK_PREPARE_ROOT
	mounts string // AIRLOCK_PREPARE_MOUNTS
	socket string // AIRLOCK_DOCKER_SOCKET
	// daemonJSON is AIRLOCK_DOCKER_DAEMON_JSON (absent until a test writes it) and
	// pidfile AIRLOCK_DOCKERD_PIDFILE.
	daemonJSON string
	pidfile    string
}

// newFakeHost has the given commands as stubs that fail if run (a probe must only look
// them up), the given files, and /sys/fs/bpf mounted when bpffs.
func newFakeHost(t *testing.T, commands, files []string, bpffs bool) *fakeHost {
	t.Helper()
	dir := t.TempDir()
	h := &fakeHost{
		bin:    filepath.Join(dir, "bin"),
		root:   filepath.Join(dir, "root"),
		mounts: filepath.Join(dir, "mounts"),
		socket: filepath.Join(dir, "docker.sock"),

		daemonJSON: filepath.Join(dir, "etc", "docker", "daemon.json"),
		pidfile:    filepath.Join(dir, "docker.pid"),
	}
	must(t, os.MkdirAll(h.bin, 0o755))
	for _, c := range commands {
		must(t, os.WriteFile(filepath.Join(h.bin, c), []byte("#!/bin/sh\necho stub "+c+" was run >&2\nexit 99\n"), 0o755))
	}
	for _, f := range files {
		p := filepath.Join(h.root, f)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, nil, 0o644))
	}
	table := "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"
	if bpffs {
		table += "bpf /sys/fs/bpf bpf rw,relatime 0 0\n"
	}
	must(t, os.WriteFile(h.mounts, []byte(table), 0o644))
	return h
}

// plan runs prepare.sh --plan with args on the fake host and returns its lines.
func (h *fakeHost) plan(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := h.run(append([]string{"--plan"}, args...)...)
	if err != nil {
		t.Fatalf("prepare.sh --plan: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// run runs prepare.sh with args on the fake host (for real without --plan: only what
// the fake host leaves to do must be done) and returns its combined output.
func (h *fakeHost) run(args ...string) (string, error) {
	cmd := exec.Command("/bin/bash", append([]string{"prepare.sh"}, args...)...)
	cmd.Env = []string{
		"PATH=" + h.bin,
		"AIRLOCK_PREPARE_ROOT=" + h.root,
		"AIRLOCK_PREPARE_MOUNTS=" + h.mounts,
		"AIRLOCK_DOCKER_SOCKET=" + h.socket,
		"AIRLOCK_DOCKER_DAEMON_JSON=" + h.daemonJSON,
		"AIRLOCK_DOCKERD_PIDFILE=" + h.pidfile,
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// allExcept is every command and file probe but the ones named.
func allExcept(skip ...string) (commands, files []string) {
	for p := range probes {
		if slices.Contains(skip, p) {
			continue
		}
		if strings.HasPrefix(p, "/") {
			files = append(files, p)
		} else {
			commands = append(commands, p)
		}
	}
	return commands, files
}

func installs(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "plan: install ") {
			out = append(out, strings.TrimPrefix(l, "plan: "))
		}
	}
	return out
}

// TestPlanDockerClientWithoutEngine is issue 10's first run: a docker client on the
// PATH and nothing else. The engine must be installed and started.
func TestPlanDockerClientWithoutEngine(t *testing.T) {
	h := newFakeHost(t, []string{"docker"}, nil, true)
	lines := h.plan(t)
	for _, want := range []string{
		"plan: install docker.io (dockerd not found)",
		"plan: install containerd (containerd not found)",
		"plan: install runc (runc not found)",
		"plan: install runsc (runsc not found)",
		"plan: add runtime runsc (--network=host) to " + h.daemonJSON,
		"plan: reload the engine so it lists runtime runsc",
		"plan: ok docker",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("plan lacks %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if !hasPrefix(lines, "plan: start the engine") {
		t.Errorf("plan does not start the engine:\n%s", strings.Join(lines, "\n"))
	}
}

// TestPlanEachProbe removes one probe at a time from a complete host: the plan installs
// exactly that probe's package.
func TestPlanEachProbe(t *testing.T) {
	for probe, pkg := range probes {
		t.Run(strings.TrimPrefix(strings.ReplaceAll(probe, "/", "_"), "_"), func(t *testing.T) {
			commands, files := allExcept(probe)
			h := newFakeHost(t, commands, files, true)
			got := installs(h.plan(t))
			want := []string{"install " + pkg + " (" + probe + " not found)"}
			if !slices.Equal(got, want) {
				t.Errorf("without %s: plan installs %q, want %q", probe, got, want)
			}
		})
	}
}

func TestPlanCompleteHostInstallsNothing(t *testing.T) {
	commands, files := allExcept()
	h := newFakeHost(t, commands, files, true)
	lines := h.plan(t)
	if got := installs(lines); len(got) != 0 {
		t.Errorf("complete host: plan installs %q", got)
	}
	if !slices.Contains(lines, "plan: ok bpffs on /sys/fs/bpf") {
		t.Errorf("bpffs mounted but not reported ok:\n%s", strings.Join(lines, "\n"))
	}
}

func TestPlanNoNodeSkipsNode(t *testing.T) {
	commands, files := allExcept("node", "npm")
	h := newFakeHost(t, commands, files, true)
	if got := installs(h.plan(t, "--no-node")); len(got) != 0 {
		t.Errorf("--no-node: plan installs %q", got)
	}
	if got := installs(h.plan(t)); len(got) != 2 {
		t.Errorf("without --no-node: plan installs %q, want nodejs and npm", got)
	}
}

func TestPlanMountsBPFFS(t *testing.T) {
	commands, files := allExcept()
	h := newFakeHost(t, commands, files, false)
	if lines := h.plan(t); !slices.Contains(lines, "plan: mount bpffs on /sys/fs/bpf") {
		t.Errorf("bpffs absent from the mount table but not mounted:\n%s", strings.Join(lines, "\n"))
	}
}

// TestPlanEngineAnswering serves /_ping on the fake socket, as the engine does, and
// gives the script the real curl: the engine is not started again. A socket that does
// not answer OK still gets the engine started.
func TestPlanEngineAnswering(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.SkipOrFail(t, "curl not installed: run deploy/host/prepare.sh")
	}
	commands, files := allExcept("curl")
	h := newFakeHost(t, commands, files, true)
	must(t, os.Symlink(curl, filepath.Join(h.bin, "curl")))
	ln, err := net.Listen("unix", h.socket)
	must(t, err)
	answer := "OK"
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_ping" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(answer))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	if lines := h.plan(t); !slices.Contains(lines, "plan: ok engine answering on "+h.socket) {
		t.Errorf("engine answers /_ping but the plan does not say so:\n%s", strings.Join(lines, "\n"))
	}
	answer = "starting"
	if lines := h.plan(t); !hasPrefix(lines, "plan: start the engine") {
		t.Errorf("engine does not answer OK but the plan does not start it:\n%s", strings.Join(lines, "\n"))
	}
}

// TestNonRootRefused runs the script as nobody (through setpriv when the test is root).
func TestNonRootRefused(t *testing.T) {
	cmd := exec.Command("/bin/bash", "prepare.sh")
	if os.Geteuid() == 0 {
		cmd = exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/bash", "prepare.sh")
	}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "must run as root") {
		t.Errorf("unprivileged run: err %v, output %s", err, out)
	}
}

func hasPrefix(lines []string, prefix string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
