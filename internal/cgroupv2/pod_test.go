package cgroupv2

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestOfPod(t *testing.T) {
	const uid = "0b6f1c2e-5a4d-4e8b-9c1f-3d2e1a0b9c8d"
	for _, tc := range []struct {
		name, v2, pod string
	}{
		{"unified, cgroupfs, besteffort", "", "kubepods/besteffort/pod" + uid},
		{"hybrid, cgroupfs, guaranteed", "unified", "kubepods/pod" + uid},
		{"unified, systemd, burstable", "", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b6f1c2e_5a4d_4e8b_9c1f_3d2e1a0b9c8d.slice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			v2 := filepath.Join(root, tc.v2)
			if err := os.MkdirAll(filepath.Join(v2, tc.pod, "c1"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(v2, "cgroup.controllers"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := OfPod(root, uid)
			if err != nil || got != filepath.Join(v2, tc.pod) {
				t.Fatalf("OfPod = %q, %v; want %q", got, err, filepath.Join(v2, tc.pod))
			}
			if _, err := OfPod(root, "1111"); !errors.Is(err, ErrNoPodCgroup) {
				t.Fatalf("another pod: err %v, want ErrNoPodCgroup", err)
			}
		})
	}
	if _, err := OfPod(t.TempDir(), uid); !errors.Is(err, ErrNoCgroup2) {
		t.Fatalf("no cgroup2 under the root: err %v, want ErrNoCgroup2", err)
	}
	if _, err := OfPod("", "../x"); err == nil {
		t.Fatal("a path-like UID was accepted")
	}
}
