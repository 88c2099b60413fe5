package kube_test

import (
	"path"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/sandboximage"
)

// imagePaths are files Airlock's own images ship (sandboximage) and that a sandbox
// names at run time; a mount at or above any of them would hide it.
var imagePaths = []string{
	sandboximage.BrowserEntrypoint, // /opt/airlock/browser.sh
	"/opt/airlock",                 // anything else an image keeps there
	sandboximage.GoKernelPath,
	sandboximage.KernelDir,
	"/entrypoint",
	"/etc/ssl/certs/ca-certificates.crt", // read by the trust init container
}

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	dir = path.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// TestExecdMountHidesNoImagePath checks that no container of a sandbox's pod (the
// execd and trust init containers, the sandbox container) mounts execd's emptyDir
// (or the token's) over a path an image uses: the browser image's
// /opt/airlock/browser.sh was hidden when the emptyDir sat at /opt/airlock, and
// execd failed with "fork/exec /opt/airlock/browser.sh: no such file or directory".
func TestExecdMountHidesNoImagePath(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	spec := lifecycle.Spec{
		SandboxID:    "browser1",
		Image:        sandboximage.BrowserRepository + ":latest",
		Entrypoint:   []string{sandboximage.BrowserEntrypoint},
		TrustedCAPEM: []byte(testCA),
		ExecdToken:   "tok",
		Hold:         true,
	}
	if _, err := rt.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(t.Context(), kube.PodName(spec.SandboxID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs := append(pod.Spec.InitContainers, pod.Spec.Containers...)
	if len(cs) != 3 {
		t.Fatalf("containers %d, want execd, trust, sandbox", len(cs))
	}
	for _, c := range cs {
		if len(c.VolumeMounts) == 0 {
			t.Errorf("container %s mounts nothing", c.Name)
		}
		for _, m := range c.VolumeMounts {
			for _, p := range imagePaths {
				if under(p, m.MountPath) || under(m.MountPath, p) {
					t.Errorf("container %s mounts %s at %s, which hides or sits inside the image's %s", c.Name, m.Name, m.MountPath, p)
				}
			}
		}
	}
	for _, p := range []string{kube.ExecdPath, kube.TrustBundlePath, kube.TrustExtraPath} {
		if !under(p, kube.ExecdDir) {
			t.Errorf("%s is outside execd's folder %s", p, kube.ExecdDir)
		}
	}
}
