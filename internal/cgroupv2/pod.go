package cgroupv2

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNoPodCgroup means no cgroup v2 directory of the pod was found under the root: the
// pod is not on this node, kubelet has not made its cgroup yet, or kubelet uses a
// layout OfPod does not know (a --cgroup-root other than /, a custom QoS hierarchy).
var ErrNoPodCgroup = errors.New("cgroupv2: no cgroup v2 directory of the pod")

// Root returns the cgroup v2 hierarchy at or below dir: dir itself when it is a cgroup2
// directory (it holds cgroup.controllers: a unified host, /sys/fs/cgroup), else
// dir/unified (a hybrid host, where /sys/fs/cgroup is a tmpfs of v1 controllers with
// the v2 hierarchy at unified/). dir "" means Mount(), this mount namespace's cgroup2.
// Errors: ErrNoCgroup2 when neither holds a cgroup2 directory.
func Root(dir string) (string, error) {
	if dir == "" {
		return Mount()
	}
	for _, d := range []string{dir, filepath.Join(dir, "unified")} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.controllers")); err == nil {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("%w at %s or %s/unified", ErrNoCgroup2, dir, dir)
}

// PodDirs are the cgroup v2 directories, relative to the hierarchy's root, where kubelet
// puts the pod with UID uid, in the order OfPod tries them: the cgroupfs driver's
// kubepods/pod<uid> (Guaranteed), kubepods/burstable/pod<uid> and
// kubepods/besteffort/pod<uid>, then the systemd driver's kubepods.slice/... with the
// UID's dashes as underscores. Every container of the pod (the sandbox "pause"
// container, init containers, app containers) is a directory below it.
func PodDirs(uid string) []string {
	u := strings.ReplaceAll(uid, "-", "_")
	return []string{
		"kubepods/pod" + uid,
		"kubepods/burstable/pod" + uid,
		"kubepods/besteffort/pod" + uid,
		"kubepods.slice/kubepods-pod" + u + ".slice",
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice",
	}
}

// OfPod returns the absolute cgroup v2 directory of the pod with UID uid under root
// (Root's argument: a cgroup v2 directory, or a directory holding one at unified/; ""
// for this mount namespace's). Errors: ErrNoCgroup2, ErrNoPodCgroup, or an empty or
// path-like uid.
func OfPod(root, uid string) (string, error) {
	if uid == "" || strings.ContainsAny(uid, "/.") {
		return "", fmt.Errorf("cgroupv2: %q is not a pod UID", uid)
	}
	mnt, err := Root(root)
	if err != nil {
		return "", err
	}
	for _, rel := range PodDirs(uid) {
		dir := filepath.Join(mnt, rel)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w: pod %s under %s", ErrNoPodCgroup, uid, mnt)
}
