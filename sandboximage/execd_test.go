package sandboximage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	execdtest.Cleanup()
	os.Exit(code)
}

// TestBuildExecd builds the execd image from the real static execd under a throwaway
// repository, runs its install mode the way the Kubernetes init container does (as its
// non-root user, into a mounted folder), and checks the build cache.
func TestBuildExecd(t *testing.T) {
	testenv.NeedDocker(t)
	bin := execdtest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	suffix := make([]byte, 4)
	rand.Read(suffix)
	repo := "airlock-test/execd-" + hex.EncodeToString(suffix)
	b := &Builder{Docker: cli}
	res, err := b.BuildExecd(ctx, repo, bin, "9.9.9", false)
	t.Cleanup(func() {
		for _, ref := range []string{repo + ":9.9.9", repo + ":latest"} {
			exec.Command("docker", "image", "rm", "-f", ref).Run()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cached || len(res.Refs) != 2 || res.Refs[0] != repo+":9.9.9" || res.Refs[1] != repo+":latest" || res.ImageID == "" {
		t.Fatalf("result %+v", res)
	}
	out, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}", repo+":latest").Output()
	if err != nil || strings.TrimSpace(string(out)) != `["/execd"] `+ExecdUser {
		t.Errorf("image config %q (%v)", out, err)
	}

	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil { // an emptyDir is writable by any user
		t.Fatal(err)
	}
	out, err = exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", "-v", dir+":/opt/airlock",
		repo+":9.9.9", "--install", "/opt/airlock/execd").CombinedOutput()
	if err != nil {
		t.Fatalf("install mode in the image: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(bin)
	got, err := os.ReadFile(filepath.Join(dir, "execd"))
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("the installed execd differs from the binary (%v)", err)
	}

	again, err := b.BuildExecd(ctx, repo, bin, "9.9.9", false)
	if err != nil || !again.Cached || again.ImageID != res.ImageID {
		t.Errorf("second build %+v %v, want cached", again, err)
	}
}

func TestBuildExecdRefusesDynamicOrNonELF(t *testing.T) {
	b := &Builder{}
	notELF := filepath.Join(t.TempDir(), "execd")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BuildExecd(context.Background(), "", notELF, "1", false); err == nil || !strings.Contains(err.Error(), "ELF") {
		t.Errorf("script: %v", err)
	}
	sh, err := exec.LookPath("sh") // dynamically linked on Debian
	if err != nil {
		t.Fatalf("no sh on this host to test a dynamically linked binary: %v", err)
	}
	sh, _ = filepath.EvalSymlinks(sh)
	if _, err := b.BuildExecd(context.Background(), "", sh, "1", false); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic binary %s: %v", sh, err)
	}
}
