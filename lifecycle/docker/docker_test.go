package docker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
)

const network = "altest-dk0"

func TestMain(m *testing.M) {
	code := m.Run()
	lctest.RemoveNetwork(network)
	os.Exit(code)
}

func newRuntime(t *testing.T, mut func(*docker.Config)) (*docker.Runtime, *client.Client, string) {
	t.Helper()
	img := testenv.NeedSandboxImage(t)
	cli := lctest.Docker(t)
	cfg := docker.Config{
		Client:     cli,
		Instance:   fmt.Sprintf("dktest%d", time.Now().UnixNano()),
		Network:    network,
		ExecdPath:  lctest.Execd(t),
		NamePrefix: "altest-dk-",
	}
	if mut != nil {
		mut(&cfg)
	}
	rt, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		insts, _ := rt.List(ctx)
		for _, in := range insts {
			_ = rt.Remove(ctx, in)
		}
	})
	return rt, cli, img
}

func spec(id, img string) lifecycle.Spec {
	return lifecycle.Spec{
		SandboxID:   id,
		Image:       img,
		Entrypoint:  []string{"tail", "-f", "/dev/null"},
		Env:         map[string]string{"A": "1"},
		NanoCPUs:    500_000_000,
		MemoryBytes: 256 << 20,
		Pids:        512,
	}
}

// TestContainerSettings checks what a sandbox container is made of: execd copied in and
// wrapping the entrypoint as PID 1, limits, dropped capabilities, no-new-privileges,
// labels, the isolated network, and pause/resume/remove.
func TestContainerSettings(t *testing.T) {
	rt, cli, img := newRuntime(t, nil)
	ctx := t.Context()
	inst, err := rt.Create(ctx, spec("dkset1", img))
	if err != nil {
		t.Fatal(err)
	}
	if !inst.Address.IsValid() || inst.Pid == 0 || inst.Phase != lifecycle.PhaseRunning {
		t.Fatalf("instance %+v", inst)
	}
	res, err := cli.ContainerInspect(ctx, inst.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Container
	if want := []string{docker.ExecdPath, "--exec", "--", "tail", "-f", "/dev/null"}; !slices.Equal(c.Config.Entrypoint, want) || len(c.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q", c.Config.Entrypoint, c.Config.Cmd)
	}
	if c.Path != docker.ExecdPath {
		t.Errorf("PID 1 is %s", c.Path)
	}
	hc := c.HostConfig
	for _, capName := range []string{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "MKNOD"} {
		if !slices.ContainsFunc(hc.CapDrop, func(s string) bool { return s == capName || s == "CAP_"+capName }) {
			t.Errorf("capability %s not dropped: %v", capName, hc.CapDrop)
		}
	}
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
		t.Errorf("security options %v", hc.SecurityOpt)
	}
	if hc.NanoCPUs != 500_000_000 || hc.Memory != 256<<20 || hc.MemorySwap != 256<<20 || hc.PidsLimit == nil || *hc.PidsLimit != 512 {
		t.Errorf("limits cpu=%d mem=%d swap=%d pids=%v", hc.NanoCPUs, hc.Memory, hc.MemorySwap, hc.PidsLimit)
	}
	if c.Config.Labels[docker.LabelSandboxID] != "dkset1" || !slices.Contains(c.Config.Env, "A=1") {
		t.Errorf("labels %v env %v", c.Config.Labels, c.Config.Env)
	}
	st, err := cli.ContainerStatPath(ctx, inst.ContainerID, client.ContainerStatPathOptions{Path: docker.ExecdPath})
	if err != nil || st.Stat.Mode.Perm() != 0o755 || st.Stat.Size == 0 {
		t.Errorf("execd in the container: %+v %v", st.Stat, err)
	}
	nres, err := cli.NetworkInspect(ctx, network, client.NetworkInspectOptions{})
	if err != nil || nres.Network.Options["com.docker.network.bridge.enable_icc"] != "false" {
		t.Errorf("network options %v %v", nres.Network.Options, err)
	}
	if _, subnet, gw := rt.Network(); !subnet.Contains(inst.Address) || !gw.IsValid() {
		t.Errorf("address %s not in subnet %s (gateway %s)", inst.Address, subnet, gw)
	}

	// From inside: PID 1 runs with no-new-privileges and without the dropped capabilities.
	out, err := exec.Command("docker", "exec", inst.ContainerID, "cat", "/proc/1/status").Output()
	if err != nil {
		t.Fatal(err)
	}
	var noNewPrivs, capBnd string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
			noNewPrivs = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			capBnd = strings.TrimSpace(v)
		}
	}
	bnd, _ := strconv.ParseUint(capBnd, 16, 64)
	// CAP_MKNOD 27, CAP_NET_ADMIN 12, CAP_NET_RAW 13, CAP_SYS_ADMIN 21, CAP_SYS_MODULE 16, CAP_SYS_PTRACE 19.
	for _, bit := range []uint{27, 12, 13, 21, 16, 19} {
		if bnd&(1<<bit) != 0 {
			t.Errorf("capability bit %d still in the bounding set %s", bit, capBnd)
		}
	}
	if noNewPrivs != "1" {
		t.Errorf("NoNewPrivs %q", noNewPrivs)
	}

	if err := rt.Pause(ctx, inst.ContainerID); err != nil {
		t.Fatal(err)
	}
	if got, _ := rt.Inspect(ctx, inst.ContainerID); got.Phase != lifecycle.PhasePaused {
		t.Errorf("after pause: %s", got.Phase)
	}
	// Remove works on a paused container.
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Inspect(ctx, inst.ContainerID); err != lifecycle.ErrInstanceGone {
		t.Errorf("after remove: %v", err)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

// TestNamedVolumeSubPath mounts a directory inside a named volume the runtime creates,
// and removes the volume with the sandbox when asked.
func TestNamedVolumeSubPath(t *testing.T) {
	rt, cli, img := newRuntime(t, nil)
	ctx := t.Context()
	vol := fmt.Sprintf("altest-dk-vol-%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = cli.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{Force: true}) })
	s := spec("dkvol1", img)
	s.Volumes = []lifecycle.Volume{{
		Name: "data", MountPath: "/data", SubPath: "sub/dir",
		PVC: &lifecycle.PVCVolume{ClaimName: vol, DeleteOnSandboxTermination: true},
	}}
	inst, err := rt.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(inst.DeleteVolumes, []string{vol}) {
		t.Errorf("delete volumes %v", inst.DeleteVolumes)
	}
	vres, err := cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.ContainerInspect(ctx, inst.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var src string
	for _, m := range res.Container.Mounts {
		if m.Destination == "/data" {
			src = m.Source
		}
	}
	if want := filepath.Join(vres.Volume.Mountpoint, "sub/dir"); src != want {
		t.Errorf("mounted %q, want %q", src, want)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err == nil {
		t.Errorf("volume %s survived its sandbox", vol)
	}

	// createIfNotExists=false on a missing volume is refused, with nothing left behind.
	no := false
	s2 := spec("dkvol2", img)
	s2.Volumes = []lifecycle.Volume{{Name: "d", MountPath: "/d", PVC: &lifecycle.PVCVolume{ClaimName: vol + "-missing", CreateIfNotExists: &no}}}
	if _, err := rt.Create(ctx, s2); err == nil {
		t.Fatal("create with a missing volume succeeded")
	}
	if insts, _ := rt.List(ctx); len(insts) != 0 {
		t.Errorf("%d containers left", len(insts))
	}
}

// TestOCIRuntimeByName passes the configured runtime to the engine; a sandbox's own
// runtime (Spec.OCIRuntime) replaces it, and an unknown one fails the create and
// leaves nothing behind (an unknown default fails Setup: TestDefaultRuntimeMustExist).
func TestOCIRuntimeByName(t *testing.T) {
	rt, cli, img := newRuntime(t, func(c *docker.Config) { c.OCIRuntime = "runc" })
	ctx := t.Context()
	inst, err := rt.Create(ctx, spec("dkrt1", img))
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.ContainerInspect(ctx, inst.ContainerID, client.ContainerInspectOptions{})
	if err != nil || res.Container.HostConfig.Runtime != "runc" {
		t.Errorf("runtime %q %v", res.Container.HostConfig.Runtime, err)
	}
	rm := func(inst lifecycle.Instance) {
		if err := rt.Remove(ctx, inst); err != nil {
			t.Fatal(err)
		}
	}
	rm(inst)
	bad := spec("dkrt2", img)
	bad.OCIRuntime = "airlock-no-such-runtime"
	if _, err := rt.Create(ctx, bad); err == nil {
		t.Fatal("create with an unknown OCI runtime succeeded")
	}
	if insts, _ := rt.List(ctx); len(insts) != 0 {
		t.Errorf("%d containers left", len(insts))
	}
}

// TestExecdTemplate: sandboxes of one image start from one template image that holds
// execd (label with the execd hash); the template keeps the image's own config (env,
// workdir); a template removed behind the runtime's back is rebuilt at the next create.
func TestExecdTemplate(t *testing.T) {
	rt, cli, base := newRuntime(t, nil)
	ctx := t.Context()
	// An image of this test's own (one label more): its template is not shared with
	// the other packages' tests running at the same time, so it can be removed.
	img := fmt.Sprintf("altest-tpl:%d", time.Now().UnixNano())
	cres, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: base}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cli.ContainerCommit(ctx, cres.ID, client.ContainerCommitOptions{Reference: img, Changes: []string{"LABEL airlock.test=template"}})
	cli.ContainerRemove(ctx, cres.ID, client.ContainerRemoveOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		res, _ := cli.ImageList(context.Background(), client.ImageListOptions{Filters: client.Filters{}.Add("label", "airlock.test=template")})
		for _, im := range res.Items {
			cli.ImageRemove(context.Background(), im.ID, client.ImageRemoveOptions{Force: true})
		}
	})
	a, err := rt.Create(ctx, spec("dktpl1", img))
	if err != nil {
		t.Fatal(err)
	}
	b, err := rt.Create(ctx, spec("dktpl2", img))
	if err != nil {
		t.Fatal(err)
	}
	imageOf := func(cid string) string {
		res, err := cli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Container.Config.Image
	}
	tpl := imageOf(a.ContainerID)
	if !strings.HasPrefix(tpl, docker.TemplateRepository+":") || imageOf(b.ContainerID) != tpl {
		t.Fatalf("sandboxes run %q and %q, want one template of %s", tpl, imageOf(b.ContainerID), docker.TemplateRepository)
	}
	ires, err := cli.ImageInspect(ctx, tpl)
	if err != nil || ires.Config.Labels[docker.LabelTemplate] == "" {
		t.Fatalf("template %s: labels %v %v", tpl, ires.Config, err)
	}
	bres, err := cli.ImageInspect(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if ires.Config.WorkingDir != bres.Config.WorkingDir || !slices.Equal(ires.Config.Env, bres.Config.Env) {
		t.Errorf("template config differs from the image's: workdir %q env %v, want %q %v",
			ires.Config.WorkingDir, ires.Config.Env, bres.Config.WorkingDir, bres.Config.Env)
	}
	out, err := exec.Command("docker", "exec", a.ContainerID, "sh", "-c", "pwd; echo $A").Output()
	if err != nil || strings.Fields(string(out))[0] != bres.Config.WorkingDir || strings.Fields(string(out))[1] != "1" {
		t.Errorf("inside the sandbox: %q %v", out, err)
	}

	// Gone behind our back: rebuilt.
	for _, in := range []lifecycle.Instance{a, b} {
		if err := rt.Remove(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.ImageRemove(ctx, tpl, client.ImageRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Create(ctx, spec("dktpl3", img))
	if err != nil {
		t.Fatalf("create after the template was removed: %v", err)
	}
	if imageOf(c.ContainerID) != tpl {
		t.Errorf("rebuilt template %q, want %q", imageOf(c.ContainerID), tpl)
	}
	if err := rt.Remove(ctx, c); err != nil { // before the images go (Cleanup)
		t.Fatal(err)
	}
}

// TestStaleTemplatesKeepSnapshots: a runtime's start removes the execd templates of
// other execd builds that no container uses, and never a snapshot image, though the
// engine's commit leaves the template's label on it (an upgrade's start removed every
// snapshot no sandbox ran; concurrent test processes removed each other's).
func TestStaleTemplatesKeepSnapshots(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	cli := lctest.Docker(t)
	ctx := t.Context()
	n := time.Now().UnixNano()
	other := fmt.Sprintf("altest-other-%d", n) // the template label of another execd build
	stale := fmt.Sprintf("%s:altest-stale-%d", docker.TemplateRepository, n)
	snap := fmt.Sprintf("%s:altest-%d", docker.SnapshotRepository, n)
	cres, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: img}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(context.Background(), cres.ID, client.ContainerRemoveOptions{Force: true})
	for ref, labels := range map[string][]string{
		stale: {docker.LabelTemplate + "=" + other},
		snap:  {docker.LabelTemplate + "=" + other, docker.LabelSnapshot + "=" + fmt.Sprint(n)},
	} {
		var changes []string
		for _, l := range labels {
			changes = append(changes, "LABEL "+l)
		}
		if _, err := cli.ContainerCommit(ctx, cres.ID, client.ContainerCommitOptions{Reference: ref, Changes: changes}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true}) })
	}
	newRuntime(t, nil) // its start removes stale templates
	if _, err := cli.ImageInspect(ctx, stale); err == nil {
		t.Errorf("the stale template %s is still there", stale)
	}
	if _, err := cli.ImageInspect(ctx, snap); err != nil {
		t.Fatalf("the snapshot image %s is gone: %v", snap, err)
	}
	if got := docker.TemplateTags(map[string]string{docker.LabelTemplate: other}, []string{stale, snap, "other:tag"}); !slices.Equal(got, []string{stale}) {
		t.Errorf("TemplateTags = %v, want only %s", got, stale)
	}
}
