package docker_test

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
)

// TestTrustBundleOncePerImage: sandboxes of one image that trust extra CAs, created at
// once (a fork), each get the image's own bundle plus their own CA, and none another's,
// while the image's bundle is read out of a container once.
func TestTrustBundleOncePerImage(t *testing.T) {
	rt, _, img := newRuntime(t, nil)
	const n = 4
	insts := make([]lifecycle.Instance, n)
	errs := make([]error, n)
	ca := func(i int) string {
		return fmt.Sprintf("-----BEGIN CERTIFICATE-----\nfake-ca-%d\n-----END CERTIFICATE-----\n", i)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sp := spec(fmt.Sprintf("dktrust%d", i), img)
			sp.TrustedCAPEM = []byte(ca(i))
			insts[i], errs[i] = rt.Create(t.Context(), sp)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := docker.BundleReads(rt); got != 1 {
		t.Errorf("the image's bundle was read %d times for %d sandboxes, want 1", got, n)
	}
	own, err := exec.Command("docker", "run", "--rm", "--entrypoint", "cat", img, docker.SystemBundle).Output()
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range insts {
		out, err := exec.Command("docker", "exec", in.ContainerID, "cat", docker.SystemBundle, docker.ExtraCAPath).Output()
		if err != nil {
			t.Fatal(err)
		}
		base := strings.TrimSuffix(string(own), "\n") + "\n"
		if len(own) == 0 {
			base = ""
		}
		if want := base + ca(i) + ca(i); string(out) != want {
			t.Errorf("sandbox %d: bundle and extra CA are not the image's bundle plus its own CA (%d bytes, want %d)", i, len(out), len(want))
		}
	}
}
