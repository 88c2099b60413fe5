// Package testenv holds the preconditions that Airlock's integration tests share:
// root, a Docker engine, eBPF, the default and code-interpreter sandbox images, and the
// benchmark switch.
//
// A test that cannot run for lack of a privilege skips with a clear reason, except when
// AIRLOCK_REQUIRE_PRIVILEGED=1 (set by .ci/run): then the same condition fails the test,
// so CI can never pass by skipping.
//
// The inner loop (`go test -short`, what `make check` runs) leaves out every test that
// needs root, Docker, eBPF, nftables, a kube-apiserver or network namespaces: the Need
// helpers skip them first, whatever AIRLOCK_REQUIRE_PRIVILEGED says, since -short asks
// for a partial run; `make test` never passes -short.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequirePrivileged reports whether AIRLOCK_REQUIRE_PRIVILEGED=1 is set.
func RequirePrivileged() bool { return os.Getenv("AIRLOCK_REQUIRE_PRIVILEGED") == "1" }

// SkipOrFail skips t with reason, or fails it when AIRLOCK_REQUIRE_PRIVILEGED=1.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if RequirePrivileged() {
		t.Fatalf("required precondition missing (AIRLOCK_REQUIRE_PRIVILEGED=1): %s", reason)
	}
	t.Skip(reason)
}

// NotShort skips t in the inner loop (go test -short: `make check`), saying it needs
// what (root, Docker, a kube-apiserver, ...). It is not a privilege skip: it never fails,
// AIRLOCK_REQUIRE_PRIVILEGED=1 or not. Every Need helper calls it first.
func NotShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs " + what + ": not in make check (go test -short)")
	}
}

// NeedRoot skips (or fails, see SkipOrFail) unless the test runs as root. It also
// skips in the inner loop (NotShort).
func NeedRoot(t testing.TB) {
	t.Helper()
	NotShort(t, "root")
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root")
	}
}

// NeedDocker skips (or fails) unless a Docker engine answers on the default socket
// (DOCKER_HOST honoured). It checks with the docker CLI-free _ping endpoint. It also
// skips in the inner loop (NotShort).
func NeedDocker(t testing.TB) {
	t.Helper()
	NotShort(t, "Docker")
	if err := dockerPing(); err != nil {
		SkipOrFail(t, "needs a running Docker engine: "+err.Error())
	}
}

// dockerPing calls GET /_ping on the engine's unix socket.
func dockerPing() error {
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		sock = strings.TrimPrefix(h, "unix://")
	}
	if _, err := os.Stat(sock); err != nil {
		return fmt.Errorf("no socket at %s", sock)
	}
	client := &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{DialContext: unixDialer(sock)},
	}
	resp, err := client.Get("http://docker/_ping")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("engine answered %s", resp.Status)
	}
	return nil
}

// SandboxImage is the default sandbox image the integration tests run. Override with
// AIRLOCK_TEST_IMAGE.
func SandboxImage() string {
	if img := os.Getenv("AIRLOCK_TEST_IMAGE"); img != "" {
		return img
	}
	return "airlock/sandbox:latest"
}

// NeedSandboxImage skips (or fails) unless Docker runs and the default sandbox image
// exists locally (`make image` builds it). It returns the image reference.
func NeedSandboxImage(t testing.TB) string {
	t.Helper()
	return needImage(t, "sandbox", SandboxImage())
}

// needImage skips (or fails) unless Docker runs and img exists locally.
func needImage(t testing.TB, what, img string) string {
	t.Helper()
	NeedDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, "docker", "image", "inspect", img).Run(); err != nil {
		SkipOrFail(t, fmt.Sprintf("%s image %s is missing (run `make image`)", what, img))
	}
	return img
}

// CodeInterpreterImage is the code-interpreter image the integration tests run (kernels
// for python, javascript, typescript and go). Override with AIRLOCK_TEST_CI_IMAGE.
func CodeInterpreterImage() string {
	if img := os.Getenv("AIRLOCK_TEST_CI_IMAGE"); img != "" {
		return img
	}
	return "airlock/code-interpreter:latest"
}

// NeedCodeInterpreterImage skips (or fails) unless Docker runs and the code-interpreter
// image exists locally (`make image` builds it). It returns the image reference.
func NeedCodeInterpreterImage(t testing.TB) string {
	t.Helper()
	return needImage(t, "code-interpreter", CodeInterpreterImage())
}

// BrowserImage is the browser image tests run: $AIRLOCK_BROWSER_IMAGE, else
// airlock/browser:latest (`make image` builds it).
func BrowserImage() string {
	if img := os.Getenv("AIRLOCK_BROWSER_IMAGE"); img != "" {
		return img
	}
	return "airlock/browser:latest"
}

// NeedBrowserImage skips (or fails) unless Docker runs and the browser image exists
// locally (`make image` builds it). It returns the image reference.
func NeedBrowserImage(t testing.TB) string {
	t.Helper()
	return needImage(t, "browser", BrowserImage())
}

// DesktopImage is the desktop image tests run: $AIRLOCK_DESKTOP_IMAGE, else
// airlock/desktop:latest (`make image` builds it).
func DesktopImage() string {
	if img := os.Getenv("AIRLOCK_DESKTOP_IMAGE"); img != "" {
		return img
	}
	return "airlock/desktop:latest"
}

// NeedDesktopImage skips (or fails) unless Docker runs and the desktop image exists
// locally (`make image` builds it). It returns the image reference.
func NeedDesktopImage(t testing.TB) string {
	t.Helper()
	return needImage(t, "desktop", DesktopImage())
}

// NeedBPF skips (or fails) unless the test runs as root with the BPF filesystem mounted.
func NeedBPF(t testing.TB) {
	t.Helper()
	NotShort(t, "root and eBPF")
	NeedRoot(t)
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		SkipOrFail(t, "needs /sys/fs/bpf")
	}
}

// Bench reports whether benchmarks were asked for (AIRLOCK_BENCH=1, set by `make bench`).
// Side-by-side benchmarks are tests named TestBench* that call NeedBench first.
func Bench() bool { return os.Getenv("AIRLOCK_BENCH") == "1" }

// NeedBench skips the test unless `make bench` runs it. This is not a privilege skip: a
// plain `make test` never runs the benchmarks.
func NeedBench(t testing.TB) {
	t.Helper()
	if !Bench() {
		t.Skip("benchmark: run with `make bench` (AIRLOCK_BENCH=1)")
	}
}

func unixDialer(sock string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
}

// SyncBuffer is a log sink that tests read while the code under test writes to it from
// other goroutines.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
