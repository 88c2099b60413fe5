// Package execdtest builds execd once per test process and starts it as PID 1 inside
// real containers, the way the lifecycle server does: the static binary is copied to
// /opt/airlock/execd before start and the entrypoint is
// `/opt/airlock/execd --exec -- <cmd>`. Tests reach it at the container's address on
// Docker's default bridge (no published ports).
package execdtest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
)

// Path is where execd lives inside a sandbox.
const Path = "/opt/airlock/execd"

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the path of an execd binary built from this module with
// CGO_ENABLED=0, building it on the first call of the test process.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-execdtest-")
		if err != nil {
			buildErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "execd")
		cmd := exec.Command("go", "build", "-trimpath", "-o", buildPath, "./cmd/execd")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/execd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("execdtest: %v", buildErr)
	}
	return buildPath
}

// Cleanup removes the binary Binary built; call it from TestMain after m.Run.
func Cleanup() {
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
}

// BuildGo builds the main package at pkg (a path relative to the module root, like
// "./execd/testdata/child") statically into dir and returns the binary's path.
func BuildGo(t testing.TB, pkg, dir string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the airlock module")
	}
	return filepath.Dir(mod), nil
}

// Options says which sandbox to start.
type Options struct {
	// Image is the image; testenv.SandboxImage() when empty.
	Image string
	// Cmd is the user's entrypoint run by execd; ["tail", "-f", "/dev/null"] when nil.
	Cmd []string
	// Flags are extra execd flags placed before --exec (for example --access-token x).
	Flags []string
	// Env is the container's environment (KEY=value).
	Env []string
	// NoWait skips waiting for GET /ping to answer.
	NoWait bool
}

// Sandbox is a running container with execd as PID 1.
type Sandbox struct {
	ID     string
	Name   string
	IP     netip.Addr
	URL    string // http://<ip>:44772
	Docker *client.Client
}

// Start creates, fills and starts a sandbox container and waits until execd answers
// /ping. The container is removed when the test ends. It skips (or fails under
// AIRLOCK_REQUIRE_PRIVILEGED=1) without Docker or the image.
func Start(t testing.TB, opts Options) *Sandbox {
	t.Helper()
	if opts.Image == "" {
		opts.Image = testenv.NeedSandboxImage(t)
	} else {
		testenv.NeedDocker(t)
	}
	if opts.Cmd == nil {
		opts.Cmd = []string{"tail", "-f", "/dev/null"}
	}
	bin := Binary(t)
	docker, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	t.Cleanup(func() { docker.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	name := UniqueName("airlock-execdtest")
	args := append(append(slices.Clone(opts.Flags), "--exec", "--"), opts.Cmd...)
	created, err := docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:       name,
		Config:     &container.Config{Image: opts.Image, Entrypoint: []string{Path}, Cmd: args, Env: opts.Env},
		HostConfig: &container.HostConfig{NetworkMode: "bridge"},
	})
	if err != nil {
		t.Fatalf("creating the container: %v", err)
	}
	sb := &Sandbox{ID: created.ID, Name: name, Docker: docker}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		docker.ContainerRemove(ctx, sb.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	})
	if err := CopyFile(ctx, docker, sb.ID, bin, Path); err != nil {
		t.Fatalf("copying execd into the container: %v", err)
	}
	if _, err := docker.ContainerStart(ctx, sb.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("starting the container: %v", err)
	}
	insp, err := docker.ContainerInspect(ctx, sb.ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("inspecting the container: %v", err)
	}
	if ep := insp.Container.NetworkSettings.Networks["bridge"]; ep != nil {
		sb.IP = ep.IPAddress
	}
	if !sb.IP.IsValid() {
		t.Fatalf("container %s has no address on the default bridge", name)
	}
	sb.URL = "http://" + netip.AddrPortFrom(sb.IP, opensandbox.ExecdPort).String()
	if !opts.NoWait {
		sb.WaitReady(t)
	}
	return sb
}

// WaitReady polls GET /ping until it answers 200 (at most 60 s, as the SDK does).
func (sb *Sandbox) WaitReady(t testing.TB) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(sb.URL + "/ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("execd in %s never answered /ping: %v (logs: %s)", sb.Name, err, sb.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Logs returns the container's output (docker logs), for failure messages.
func (sb *Sandbox) Logs() string {
	out, _ := exec.Command("docker", "logs", "--tail", "50", sb.ID).CombinedOutput()
	return string(out)
}

// CopyFile copies the local file src into the container at dst (an absolute path),
// creating its parent directories, mode 0755.
func CopyFile(ctx context.Context, docker *client.Client, id, src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	rel := strings.TrimPrefix(filepath.Clean(dst), "/")
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/") + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o755, Size: int64(len(data))}); err != nil {
		return err
	}
	tw.Write(data)
	if err := tw.Close(); err != nil {
		return err
	}
	_, err = docker.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: "/", Content: &buf})
	return err
}

// UniqueName returns prefix-<random hex>, for Docker objects a test creates.
func UniqueName(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:]) + "-" + strconv.Itoa(os.Getpid())
}
