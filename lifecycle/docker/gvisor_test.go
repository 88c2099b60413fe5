package docker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/cgroupv2"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// needRunsc skips (fails under AIRLOCK_REQUIRE_PRIVILEGED=1) when the engine has no
// runtime runsc, which make prepare registers.
func needRunsc(t *testing.T) {
	t.Helper()
	res, err := lctest.Docker(t).Info(t.Context(), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Info.Runtimes["runsc"]; !ok {
		testenv.SkipOrFail(t, "the engine has no runtime runsc: run make prepare")
	}
}

// TestGVisorSandboxes creates sandboxes under gVisor for real, through the lifecycle
// API: per sandbox with extensions["airlock.dev/runtime"], and refused with a JSON 400
// for a runtime the engine lacks. On gVisor the held entrypoint is released, commands
// and files work, pause and resume work, and the Sentry gets a cgroup v2 of its own
// (not the host's root, where egressd would never attach).
func TestGVisorSandboxes(t *testing.T) {
	testenv.NeedRoot(t)
	needRunsc(t)
	h := lctest.New(t, lctest.Options{})
	api, err := sdk.New(sdk.Config{BaseURL: h.HTTP.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	for _, c := range []struct{ name, value, want string }{
		{"unknown", "nosuchruntime", `the engine has no runtime "nosuchruntime"`},
		{"malformed", "../runsc", "is not a runtime name"},
	} {
		_, err := api.Create(ctx, sdk.CreateRequest{Image: h.Image, Extensions: map[string]string{lifecycle.ExtRuntime: c.value}})
		var ae *sdk.APIError
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != "INVALID_REQUEST" || !strings.Contains(ae.Message, c.want) {
			t.Errorf("%s runtime: err %v, want a 400 INVALID_REQUEST naming %q", c.name, err, c.want)
		}
	}

	sb, err := api.Create(ctx, sdk.CreateRequest{
		Image:      h.Image,
		Env:        map[string]string{"GREETING": "hello"},
		Timeout:    10 * time.Minute,
		Extensions: map[string]string{lifecycle.ExtRuntime: "runsc"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.WaitState(ctx, sb.ID, opensandbox.Running, 50*time.Millisecond); err != nil {
		t.Fatalf("gVisor sandbox never Running (execd hold and release): %v", err)
	}
	insts, err := h.Runtime.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(insts, func(in lifecycle.Instance) bool { return in.SandboxID == sb.ID })
	if i < 0 {
		t.Fatalf("no container for %s", sb.ID)
	}
	res, err := lctest.Docker(t).ContainerInspect(ctx, insts[i].ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rt := res.Container.HostConfig.Runtime; rt != "runsc" {
		t.Errorf("container runtime %q, want runsc", rt)
	}
	pid := res.Container.State.Pid
	dir, err := cgroupv2.OfPid(pid)
	if err != nil && !errors.Is(err, cgroupv2.ErrNoCgroup2) {
		t.Fatal(err)
	}
	if err == nil && cgroupv2.IsRoot(dir) {
		t.Errorf("the gVisor sandbox process %d is in the cgroup v2 root", pid)
	}

	x, err := api.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) (string, int) {
		t.Helper()
		ex, err := x.Run(ctx, sdk.Command{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return strings.TrimSpace(strings.Join(ex.Stdout, "\n")), ex.ExitCode()
	}
	// gVisor's kernel announces itself in dmesg; runc would show the host's.
	if out, code := run("dmesg | head -1; echo $GREETING"); code != 0 || !strings.Contains(out, "gVisor") || !strings.HasSuffix(out, "hello") {
		t.Errorf("dmesg and env in the sandbox: exit %d %q, want gVisor's banner and hello", code, out)
	}
	if _, code := run("exit 3"); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
	data := []byte("written on gVisor\n")
	if err := x.WriteFile(ctx, "/tmp/g/file.txt", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := x.ReadFile(ctx, "/tmp/g/file.txt"); err != nil || !bytes.Equal(got, data) {
		t.Errorf("read back %q %v", got, err)
	}
	if out, _ := run("cat /tmp/g/file.txt"); out != strings.TrimSpace(string(data)) {
		t.Errorf("cat = %q", out)
	}
	if err := api.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := api.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, _ := run("echo after resume"); out != "after resume" {
		t.Errorf("after resume: %q", out)
	}

	// Killing the sandbox removes the cgroup Airlock made for it.
	if err := api.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if mnt, err := cgroupv2.Mount(); err == nil {
		own := filepath.Join(mnt, "airlock", insts[i].ContainerID)
		if _, err := os.Stat(own); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after kill (%v)", own, err)
		}
	}
}

// TestDefaultRuntimeMustExist: a runtime whose default OCI runtime the engine lacks
// does not start.
func TestDefaultRuntimeMustExist(t *testing.T) {
	testenv.NeedSandboxImage(t)
	rt, err := docker.New(docker.Config{
		Client:     lctest.Docker(t),
		Instance:   fmt.Sprintf("dktest%d", time.Now().UnixNano()),
		Network:    network,
		ExecdPath:  lctest.Execd(t),
		OCIRuntime: "nosuchruntime",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Setup(t.Context()); err == nil || !strings.Contains(err.Error(), `no runtime "nosuchruntime"`) {
		t.Errorf("Setup with a missing default runtime: %v", err)
	}
}
