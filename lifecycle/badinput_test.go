package lifecycle_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
)

// TestBadInput sends malformed or forbidden create requests: each gets its exact status
// and code, and nothing is left behind (no container, no record).
func TestBadInput(t *testing.T) {
	root := t.TempDir()
	allowed := filepath.Join(root, "allowed")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{allowed, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink inside the allowed root that points outside it.
	if err := os.Symlink(outside, filepath.Join(allowed, "escape")); err != nil {
		t.Fatal(err)
	}
	h := lctest.New(t, lctest.Options{APIKey: testKey, AllowedHostRoots: []string{allowed}})
	c := newClient(t, h)

	with := func(mut func(map[string]any)) map[string]any {
		r := baseReq(h.Image, map[string]string{"k": "v"})
		mut(r)
		return r
	}
	hostVol := func(p string) []any {
		return []any{map[string]any{"name": "data", "host": map[string]any{"path": p}, "mountPath": "/data"}}
	}
	cases := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"malformed_json", `{"image": {"uri": `, 400, "INVALID_JSON"},
		{"empty_body", ``, 400, "INVALID_JSON"},
		{"wrong_type", `{"image": "x"}`, 400, "INVALID_JSON"},
		{"trailing_data", `{} {}`, 400, "INVALID_JSON"},
		{"no_image", with(func(r map[string]any) { delete(r, "image") }), 400, "INVALID_REQUEST"},
		{"no_entrypoint", with(func(r map[string]any) { delete(r, "entrypoint") }), 400, "INVALID_REQUEST"},
		{"timeout_too_small", with(func(r map[string]any) { r["timeout"] = 5 }), 400, "INVALID_REQUEST"},
		{"timeout_too_large", with(func(r map[string]any) { r["timeout"] = 10 * 86400 }), 400, "INVALID_REQUEST"},
		{"cpu_not_quantity", with(func(r map[string]any) { r["resourceLimits"] = map[string]string{"cpu": "lots"} }), 400, "INVALID_RESOURCE_LIMITS"},
		{"memory_bad_suffix", with(func(r map[string]any) { r["resourceLimits"] = map[string]string{"memory": "2GB"} }), 400, "INVALID_RESOURCE_LIMITS"},
		{"memory_too_small", with(func(r map[string]any) { r["resourceLimits"] = map[string]string{"memory": "1Ki"} }), 400, "INVALID_RESOURCE_LIMITS"},
		{"cpu_above_host", with(func(r map[string]any) { r["resourceLimits"] = map[string]string{"cpu": "4096"} }), 400, "INVALID_RESOURCE_LIMITS"},
		{"gpu_unsupported", with(func(r map[string]any) { r["resourceLimits"] = map[string]string{"gpu": "1"} }), 400, "INVALID_RESOURCE_LIMITS"},
		{"env_bad_name", with(func(r map[string]any) { r["env"] = map[string]string{"1X": "y"} }), 400, "INVALID_REQUEST"},
		{"metadata_reserved", with(func(r map[string]any) { r["metadata"] = map[string]string{"opensandbox.io/x": "y"} }), 400, "INVALID_REQUEST"},
		{"metadata_bad_value", with(func(r map[string]any) { r["metadata"] = map[string]string{"k": "has space"} }), 400, "INVALID_REQUEST"},
		{"runtime_unknown", with(func(r map[string]any) { r["extensions"] = map[string]string{"airlock.dev/runtime": "nosuchruntime"} }), 400, "INVALID_REQUEST"},
		{"runtime_malformed", with(func(r map[string]any) { r["extensions"] = map[string]string{"airlock.dev/runtime": "run sc"} }), 400, "INVALID_REQUEST"},
		{"renew_ext_out_of_range", with(func(r map[string]any) { r["extensions"] = map[string]string{"access.renew.extend.seconds": "10"} }), 400, "INVALID_REQUEST"},
		{"policy_bad_action", with(func(r map[string]any) {
			r["networkPolicy"] = map[string]any{"defaultAction": "maybe"}
		}), 400, "INVALID_REQUEST"},
		{"platform_mismatch", with(func(r map[string]any) { r["platform"] = map[string]string{"os": "windows", "arch": "amd64"} }), 400, "INVALID_REQUEST"},
		{"forbidden_host_path", with(func(r map[string]any) { r["volumes"] = hostVol(outside) }), 400, "INVALID_VOLUME"},
		{"host_path_symlink_escape", with(func(r map[string]any) { r["volumes"] = hostVol(filepath.Join(allowed, "escape")) }), 400, "INVALID_VOLUME"},
		{"host_path_missing", with(func(r map[string]any) { r["volumes"] = hostVol(filepath.Join(allowed, "missing")) }), 400, "INVALID_VOLUME"},
		{"volume_two_backends", with(func(r map[string]any) {
			r["volumes"] = []any{map[string]any{"name": "d", "host": map[string]any{"path": allowed}, "pvc": map[string]any{"claimName": "x"}, "mountPath": "/d"}}
		}), 400, "INVALID_VOLUME"},
		{"volume_subpath_dotdot", with(func(r map[string]any) {
			r["volumes"] = []any{map[string]any{"name": "d", "host": map[string]any{"path": allowed}, "mountPath": "/d", "subPath": "../x"}}
		}), 400, "INVALID_VOLUME"},
		{"volume_relative_mount", with(func(r map[string]any) {
			r["volumes"] = []any{map[string]any{"name": "d", "host": map[string]any{"path": allowed}, "mountPath": "d"}}
		}), 400, "INVALID_VOLUME"},
		{"unknown_image", with(func(r map[string]any) {
			// A registry on a closed local port: the pull fails at once, on this host.
			r["image"] = map[string]any{"uri": "127.0.0.1:1/airlock-test/nope:latest"}
		}), 400, "IMAGE_UNAVAILABLE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			c.want(http.MethodPost, "/v1/sandboxes", tc.body, tc.status, tc.code)
		})
	}
	if n := countContainers(t, h); n != 0 {
		t.Errorf("%d containers left behind by rejected creates", n)
	}
	if n, _ := h.Store.Count(); n != 0 {
		t.Errorf("%d store records left behind by rejected creates", n)
	}

	// The allowed path itself works and is mounted.
	if err := os.WriteFile(filepath.Join(allowed, "probe"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(allowed, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(allowed, "sub", "inner"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = t
	sb := c.create(with(func(r map[string]any) {
		r["volumes"] = []any{
			map[string]any{"name": "data", "host": map[string]any{"path": allowed}, "mountPath": "/data"},
			map[string]any{"name": "ro", "host": map[string]any{"path": allowed}, "mountPath": "/ro", "subPath": "sub", "readOnly": true},
		}
	}))
	in, err := h.Runtime.List(t.Context())
	if err != nil || len(in) != 1 {
		t.Fatalf("containers %v %v", in, err)
	}
	// What the sandbox sees (docker exec: independent of execd).
	if out, err := exec.Command("docker", "exec", in[0].ContainerID, "cat", "/data/probe", "/ro/inner").CombinedOutput(); err != nil || string(out) != "xy" {
		t.Errorf("mounted content %q %v", out, err)
	}
	if err := exec.Command("docker", "exec", in[0].ContainerID, "touch", "/ro/new").Run(); err == nil {
		t.Errorf("readOnly mount is writable")
	}
	c.want(http.MethodDelete, "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}
