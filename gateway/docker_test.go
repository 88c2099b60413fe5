package gateway

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/gateway/internal/testupstream"
	"github.com/airlockdev/airlock/internal/testenv"
)

// upstream is where a test's sandbox application listens: on loopback in this process,
// or inside a real sandbox container on Docker's default bridge.
type upstream struct {
	addr netip.Addr
	port int
}

// direct returns a URL that reaches the application without the gateway.
func (u upstream) direct(path string) string {
	return "http://" + net.JoinHostPort(u.addr.String(), strconv.Itoa(u.port)) + path
}

func loopback(t *testing.T) upstream {
	t.Helper()
	srv := httptest.NewServer(testupstream.Handler())
	t.Cleanup(srv.Close)
	addr, port := splitHostPort(t, srv.URL)
	return upstream{addr, port}
}

// forEachUpstream runs f against a loopback application and against the same application
// in a real sandbox container (which needs Docker and the sandbox image).
func forEachUpstream(t *testing.T, f func(t *testing.T, up upstream)) {
	t.Run("loopback", func(t *testing.T) { f(t, loopback(t)) })
	t.Run("sandbox", func(t *testing.T) { f(t, sharedSandbox(t)) })
}

const containerPrefix = "airlock-gwtest-"

var (
	upstreamBinOnce sync.Once
	upstreamBin     string
	upstreamBinErr  error

	sharedOnce sync.Once
	shared     upstream
	sharedErr  error
	sharedStop func()
)

// buildUpstream builds the static test application once per test binary.
func buildUpstream(t *testing.T) string {
	t.Helper()
	upstreamBinOnce.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "airlock-gwtest-bin-")
		if err != nil {
			upstreamBinErr = err
			return
		}
		upstreamBin = filepath.Join(dir, "upstream")
		cmd := exec.Command(gobin, "build", "-trimpath", "-o", upstreamBin, "./internal/testupstream/upstream")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			upstreamBinErr = err
			upstreamBin = string(out)
		}
	})
	if upstreamBinErr != nil {
		t.Fatalf("building the test upstream: %v\n%s", upstreamBinErr, upstreamBin)
	}
	return upstreamBin
}

// sharedSandbox returns one sandbox container shared by the package's tests (removed in
// TestMain).
func sharedSandbox(t *testing.T) upstream {
	t.Helper()
	img := testenv.NeedSandboxImage(t)
	bin := buildUpstream(t)
	sharedOnce.Do(func() { shared, sharedStop, sharedErr = startSandbox(img, bin, "shared") })
	if sharedErr != nil {
		t.Fatalf("starting the shared sandbox: %v", sharedErr)
	}
	return shared
}

// ownSandbox starts a sandbox container for one test; it is removed at the test's end
// unless the test removes it first (remove is idempotent).
func ownSandbox(t *testing.T, name string) (upstream, func()) {
	t.Helper()
	img := testenv.NeedSandboxImage(t)
	bin := buildUpstream(t)
	up, stop, err := startSandbox(img, bin, name)
	if err != nil {
		t.Fatalf("starting sandbox %s: %v", name, err)
	}
	t.Cleanup(stop)
	return up, stop
}

// startSandbox creates a container from the sandbox image on Docker's default bridge,
// copies the test application in, starts it and waits until it accepts connections.
func startSandbox(img, bin, name string) (upstream, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	docker, err := client.New(client.FromEnv)
	if err != nil {
		return upstream{}, nil, err
	}
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	cname := containerPrefix + name + "-" + hex.EncodeToString(rb[:])
	created, err := docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: cname,
		Config: &container.Config{
			Image: img,
			// 8080 is the application's port; the same application answers on the control
			// ports (execd 44772, egress API 18080) for the access tests.
			Cmd:    []string{"/opt/airlock-test/upstream", "-listen", ":8080,:44772,:18080"},
			Labels: map[string]string{"airlock.dev/test": "gateway"},
		},
		HostConfig: &container.HostConfig{},
	})
	if err != nil {
		docker.Close()
		return upstream{}, nil, err
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = docker.ContainerRemove(ctx, created.ID, client.ContainerRemoveOptions{Force: true})
			docker.Close()
		})
	}
	fail := func(err error) (upstream, func(), error) { stop(); return upstream{}, nil, err }

	data, err := os.ReadFile(bin)
	if err != nil {
		return fail(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "airlock-test/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "airlock-test/upstream", Mode: 0o755, Size: int64(len(data))})
	_, _ = tw.Write(data)
	if err := tw.Close(); err != nil {
		return fail(err)
	}
	if _, err := docker.CopyToContainer(ctx, created.ID, client.CopyToContainerOptions{DestinationPath: "/opt", Content: &buf}); err != nil {
		return fail(err)
	}
	if _, err := docker.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return fail(err)
	}
	ins, err := docker.ContainerInspect(ctx, created.ID, client.ContainerInspectOptions{})
	if err != nil {
		return fail(err)
	}
	var addr netip.Addr
	if ns := ins.Container.NetworkSettings; ns != nil {
		for _, ep := range ns.Networks {
			if ep != nil && ep.IPAddress.IsValid() {
				addr = ep.IPAddress
				break
			}
		}
	}
	if !addr.IsValid() {
		return fail(errNoAddress)
	}
	up := upstream{addr: addr, port: 8080}
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr.String(), "8080"), time.Second)
		if err == nil {
			c.Close()
			return up, stop, nil
		}
		if ctx.Err() != nil {
			return fail(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errNoAddress = &net.AddrError{Err: "container has no IP address on the default bridge"}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedStop != nil {
		sharedStop()
	}
	if upstreamBin != "" && upstreamBinErr == nil {
		_ = os.RemoveAll(filepath.Dir(upstreamBin))
	}
	os.Exit(code)
}
