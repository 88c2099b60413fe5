package kube_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	os.Exit(code)
}

func crdDir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "testdata", "crds")
}

// world is a namespace on the shared API server (with the agent-sandbox CRD).
type world struct {
	env *kubetest.Env
	ns  string
	dyn dynamic.Interface
}

func newWorld(t *testing.T) *world {
	t.Helper()
	env := kubetest.Shared(t, crdDir())
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &world{env: env, ns: env.Namespace(t, "sbx"), dyn: dyn}
}

// runtime makes a runtime on w's namespace; edit changes the config first.
func (w *world) runtime(t *testing.T, edit func(*kube.Config)) *kube.Runtime {
	t.Helper()
	cfg := kube.Config{Client: w.env.Client, Dynamic: w.dyn, Namespace: w.ns, Instance: "inst-a", ExecdImage: "airlock/execd:test"}
	if edit != nil {
		edit(&cfg)
	}
	rt, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// objects counts what is left in w's namespace: pods, NetworkPolicies, Secrets and
// agent-sandbox Sandboxes.
func (w *world) objects(t *testing.T) (n int, names []string) {
	t.Helper()
	ctx := context.Background()
	pods, err := w.env.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		names = append(names, "pod/"+p.Name)
	}
	nps, err := w.env.Client.NetworkingV1().NetworkPolicies(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range nps.Items {
		names = append(names, "networkpolicy/"+p.Name)
	}
	secs, err := w.env.Client.CoreV1().Secrets(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secs.Items {
		names = append(names, "secret/"+s.Name)
	}
	sbs, err := w.dyn.Resource(kube.AgentSandboxGVR).Namespace(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs.Items {
		names = append(names, "sandbox/"+s.GetName())
	}
	return len(names), names
}

const (
	testPassword = "s3cret-Passw0rd"
	testCA       = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
)

// fullSpec uses every option of lifecycle.Spec.
func fullSpec(id string) lifecycle.Spec {
	return lifecycle.Spec{
		SandboxID:  id,
		Image:      "registry.example.com:5000/team/python:3.12",
		ImageAuth:  &lifecycle.ImageAuth{Username: "robot", Password: testPassword},
		Entrypoint: []string{"python3", "-m", "http.server", "8080"},
		Env:        map[string]string{"B": "2", "A": "1", "SSL_CERT_FILE": "/user/value"},
		NanoCPUs:   1_500_000_000, MemoryBytes: 512 << 20, Pids: 256,
		Volumes: []lifecycle.Volume{
			{Name: "data", PVC: &lifecycle.PVCVolume{ClaimName: "team-data"}, MountPath: "/data", SubPath: "projects/a", ReadOnly: true},
			{Name: "cache", Host: &lifecycle.HostVolume{Path: "/srv/airlock/cache/"}, MountPath: "/cache", SubPath: "pip"},
		},
		Platform:     &lifecycle.PlatformSpec{OS: "linux", Arch: "arm64"},
		TrustedCAPEM: []byte(testCA),
		Hold:         true,
		Egress:       lifecycle.Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/24")}},
	}
}

// TestCreateEveryOption checks the pod, pull Secret and NetworkPolicy field by field.
func TestCreateEveryOption(t *testing.T) {
	w := newWorld(t)
	var logs bytes.Buffer
	rt := w.runtime(t, func(c *kube.Config) {
		c.RuntimeClassName = "gvisor"
		c.DNS = []netip.Addr{netip.MustParseAddr("169.254.20.10")}
		c.AllowedHostRoots = []string{"/srv/airlock"}
		c.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := t.Context()
	_, err := w.env.Client.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	inst, err := rt.Create(ctx, fullSpec("abc123"))
	if err != nil {
		t.Fatal(err)
	}
	if inst.ContainerID != "sbx-abc123" || inst.SandboxID != "abc123" || inst.Phase != lifecycle.PhaseCreated || inst.Address.IsValid() {
		t.Errorf("instance %+v", inst)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-abc123", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Metadata.
	wantLabels := map[string]string{"airlock.dev/sandbox-id": "abc123", "airlock.dev/instance": "inst-a", "app.kubernetes.io/managed-by": "airlock"}
	for k, v := range wantLabels {
		if pod.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, pod.Labels[k], v)
		}
	}
	var entry []string
	if err := json.Unmarshal([]byte(pod.Annotations["airlock.dev/entrypoint"]), &entry); err != nil || !slices.Equal(entry, fullSpec("x").Entrypoint) {
		t.Errorf("entrypoint annotation %q (%v)", pod.Annotations["airlock.dev/entrypoint"], err)
	}

	// Pod-level settings.
	ps := pod.Spec
	if ps.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s", ps.RestartPolicy)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("service account token mounted")
	}
	if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
		t.Error("service links enabled")
	}
	if ps.RuntimeClassName == nil || *ps.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName %v", ps.RuntimeClassName)
	}
	if ps.DNSPolicy != corev1.DNSNone || ps.DNSConfig == nil || !slices.Equal(ps.DNSConfig.Nameservers, []string{"169.254.20.10"}) {
		t.Errorf("dns %s %+v", ps.DNSPolicy, ps.DNSConfig)
	}
	if ps.SecurityContext == nil || ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", ps.SecurityContext)
	}
	if !slices.Equal(ps.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "sbx-abc123-pull"}}) {
		t.Errorf("imagePullSecrets %v", ps.ImagePullSecrets)
	}
	if ps.NodeSelector["kubernetes.io/os"] != "linux" || ps.NodeSelector["kubernetes.io/arch"] != "arm64" {
		t.Errorf("nodeSelector %v", ps.NodeSelector)
	}
	if ps.Hostname != "abc123" {
		t.Errorf("hostname %q", ps.Hostname)
	}

	// Every container hardened.
	all := append(slices.Clone(ps.InitContainers), ps.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc.Capabilities == nil {
			t.Errorf("container %s: security context %+v", c.Name, sc)
			continue
		}
		for _, capName := range docker.DroppedCapabilities {
			if !slices.Contains(sc.Capabilities.Drop, corev1.Capability(capName)) {
				t.Errorf("container %s: capability %s not dropped", c.Name, capName)
			}
		}
		if len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s adds capabilities %v", c.Name, sc.Capabilities.Add)
		}
	}

	// Volumes: execd's emptyDir, the claim and the host path.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	if v := vols["airlock-execd"]; v.EmptyDir == nil {
		t.Errorf("execd volume %+v", v)
	}
	if v := vols["vol-0"]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "team-data" || !v.PersistentVolumeClaim.ReadOnly {
		t.Errorf("pvc volume %+v", v)
	}
	if v := vols["vol-1"]; v.HostPath == nil || v.HostPath.Path != "/srv/airlock/cache" || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
		t.Errorf("host volume %+v", v)
	}

	// Init containers: execd delivered, then the trust bundle built in the user's image.
	if len(ps.InitContainers) != 2 {
		t.Fatalf("init containers %v", ps.InitContainers)
	}
	ic := ps.InitContainers[0]
	if ic.Name != "execd" || ic.Image != "airlock/execd:test" || !slices.Equal(ic.Command, []string{"/execd", "--install", "/opt/airlock-execd/execd"}) ||
		!reflect.DeepEqual(ic.VolumeMounts, []corev1.VolumeMount{{Name: "airlock-execd", MountPath: "/opt/airlock-execd"}}) {
		t.Errorf("execd init container %+v", ic)
	}
	tc := ps.InitContainers[1]
	if tc.Name != "trust" || tc.Image != fullSpec("x").Image || !slices.Equal(tc.Command, []string{"/opt/airlock-execd/execd", "--install-trust", "/opt/airlock-execd"}) ||
		!reflect.DeepEqual(tc.Env, []corev1.EnvVar{{Name: "AIRLOCK_TRUSTED_CA", Value: testCA}}) || len(tc.VolumeMounts) != 1 || tc.VolumeMounts[0].ReadOnly {
		t.Errorf("trust init container %+v", tc)
	}

	// The sandbox container.
	if len(ps.Containers) != 1 {
		t.Fatalf("containers %v", ps.Containers)
	}
	c := ps.Containers[0]
	if c.Name != "sandbox" || c.Image != fullSpec("x").Image {
		t.Errorf("container %s image %s", c.Name, c.Image)
	}
	wantCmd := []string{"/opt/airlock-execd/execd", "--exec", "--hold", "--", "python3", "-m", "http.server", "8080"}
	if !slices.Equal(c.Command, wantCmd) || len(c.Args) != 0 {
		t.Errorf("command %q args %q, want %q", c.Command, c.Args, wantCmd)
	}
	wantEnv := []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"},
		{Name: "GIT_SSL_CAINFO", Value: kube.TrustBundlePath}, {Name: "NODE_EXTRA_CA_CERTS", Value: kube.TrustExtraPath}, {Name: "REQUESTS_CA_BUNDLE", Value: kube.TrustBundlePath},
		{Name: "SSL_CERT_FILE", Value: kube.TrustBundlePath}}
	if !reflect.DeepEqual(c.Env, wantEnv) {
		t.Errorf("env %v, want %v", c.Env, wantEnv)
	}
	for _, e := range c.Env {
		if strings.Contains(e.Value, "BEGIN CERTIFICATE") {
			t.Error("the CA reached the sandbox container's environment")
		}
	}
	wantRes := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("512Mi")}
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		if len(rl) != 2 || !rl.Cpu().Equal(wantRes[corev1.ResourceCPU]) || !rl.Memory().Equal(wantRes[corev1.ResourceMemory]) {
			t.Errorf("resources %v, want %v", rl, wantRes)
		}
	}
	if !ic.Resources.Limits.Memory().Equal(wantRes[corev1.ResourceMemory]) {
		t.Errorf("init container limits %v (a quota needs them)", ic.Resources.Limits)
	}
	wantMounts := []corev1.VolumeMount{
		{Name: "airlock-execd", MountPath: "/opt/airlock-execd", ReadOnly: true},
		{Name: "vol-0", MountPath: "/data", ReadOnly: true, SubPath: "projects/a"},
		{Name: "vol-1", MountPath: "/cache", SubPath: "pip"},
	}
	if !reflect.DeepEqual(c.VolumeMounts, wantMounts) {
		t.Errorf("mounts %+v, want %+v", c.VolumeMounts, wantMounts)
	}
	if !reflect.DeepEqual(c.Ports, []corev1.ContainerPort{{Name: "execd", ContainerPort: 44772, Protocol: corev1.ProtocolTCP}}) {
		t.Errorf("ports %v", c.Ports)
	}

	// The pull Secret: dockerconfigjson for the image's registry, owned by the pod.
	sec, err := w.env.Client.CoreV1().Secrets(w.ns).Get(ctx, "sbx-abc123-pull", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != corev1.SecretTypeDockerConfigJson || sec.Labels["airlock.dev/sandbox-id"] != "abc123" {
		t.Errorf("secret type %s labels %v", sec.Type, sec.Labels)
	}
	var dc struct {
		Auths map[string]struct{ Username, Password, Auth string } `json:"auths"`
	}
	if err := json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &dc); err != nil {
		t.Fatal(err)
	}
	a, ok := dc.Auths["registry.example.com:5000"]
	if !ok || a.Username != "robot" || a.Password != testPassword || a.Auth != base64.StdEncoding.EncodeToString([]byte("robot:"+testPassword)) {
		t.Errorf("docker config %+v", dc)
	}
	ownedByPod(t, sec.OwnerReferences, pod)

	// The NetworkPolicy, owned by the pod.
	np, err := w.env.Client.NetworkingV1().NetworkPolicies(w.ns).Get(ctx, "sbx-abc123", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ownedByPod(t, np.OwnerReferences, pod)
	checkIngress(t, np, "airlock-system")
	if got := egressPeers(np); !slices.Equal(got, []string{"53: 169.254.20.10/32", "*: 198.51.100.0/24"}) {
		t.Errorf("egress %q", got)
	}

	if strings.Contains(logs.String(), testPassword) {
		t.Error("the registry password reached the log")
	}
	if !strings.Contains(logs.String(), "sandbox created") {
		t.Errorf("log %q", logs.String())
	}
}

func ownedByPod(t *testing.T, refs []metav1.OwnerReference, pod *corev1.Pod) {
	t.Helper()
	if len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].APIVersion != "v1" || refs[0].Name != pod.Name || refs[0].UID != pod.UID {
		t.Errorf("owner references %+v, want the pod %s (%s)", refs, pod.Name, pod.UID)
	}
}

// checkIngress: only from gateway and lifecycle pods of the system namespace.
func checkIngress(t *testing.T, np *networkingv1.NetworkPolicy, system string) {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v", np.Spec.PolicyTypes)
	}
	if np.Spec.PodSelector.MatchLabels["airlock.dev/sandbox-id"] == "" || len(np.Spec.PodSelector.MatchLabels) != 1 {
		t.Errorf("pod selector %v", np.Spec.PodSelector)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 0 {
		t.Fatalf("ingress %+v", np.Spec.Ingress)
	}
	var got []string
	for _, p := range np.Spec.Ingress[0].From {
		if p.IPBlock != nil || p.NamespaceSelector == nil || p.PodSelector == nil {
			t.Errorf("ingress peer %+v", p)
			continue
		}
		got = append(got, p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]+"/"+p.PodSelector.MatchLabels["app.kubernetes.io/name"])
	}
	if want := []string{system + "/airlock-gateway", system + "/airlock-lifecycle"}; !slices.Equal(got, want) {
		t.Errorf("ingress from %q, want %q", got, want)
	}
}

// egressPeers flattens egress rules to "PORTS: PEER" strings ("*" for all ports, "any"
// for a rule without peers, "ns/pod" for selectors, "CIDR except A,B" for blocks).
func egressPeers(np *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, r := range np.Spec.Egress {
		ports := "*"
		if len(r.Ports) > 0 {
			var ps []string
			for _, p := range r.Ports {
				ps = append(ps, p.Port.String())
			}
			ps = slices.Compact(ps)
			ports = strings.Join(ps, ",")
		}
		if len(r.To) == 0 {
			out = append(out, ports+": any")
		}
		for _, p := range r.To {
			switch {
			case p.IPBlock != nil && len(p.IPBlock.Except) > 0:
				out = append(out, ports+": "+p.IPBlock.CIDR+" except "+strings.Join(p.IPBlock.Except, ","))
			case p.IPBlock != nil:
				out = append(out, ports+": "+p.IPBlock.CIDR)
			default:
				out = append(out, ports+": "+p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]+"/"+p.PodSelector.MatchLabels["k8s-app"])
			}
		}
	}
	return out
}

// TestCreateMinimal: no options, no extra objects: no pull Secret, no trust init
// container, no limits, the cluster's DNS (and kube-dns in the NetworkPolicy).
func TestCreateMinimal(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	ctx := t.Context()
	if _, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "min1", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}}); err != nil {
		t.Fatal(err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-min1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/opt/airlock-execd/execd", "--exec", "--", "sleep", "inf"}) {
		t.Errorf("command %q", c.Command)
	}
	if len(pod.Spec.InitContainers) != 1 || len(c.Env) != 0 || len(c.Resources.Limits) != 0 || len(pod.Spec.ImagePullSecrets) != 0 ||
		pod.Spec.RuntimeClassName != nil || pod.Spec.DNSPolicy == corev1.DNSNone || pod.Spec.NodeSelector != nil {
		t.Errorf("pod spec has options nobody asked for: %+v", pod.Spec)
	}
	if n, names := w.objects(t); n != 2 {
		t.Errorf("objects %v, want the pod and its NetworkPolicy", names)
	}
	np, err := w.env.Client.NetworkingV1().NetworkPolicies(w.ns).Get(ctx, "sbx-min1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := egressPeers(np); !slices.Equal(got, []string{"53: kube-system/kube-dns"}) {
		t.Errorf("egress %q, want DNS only", got)
	}
}

// TestCreateMaxPTYSessions: Config.MaxPTYSessions reaches execd's command line in the
// pod, in both layouts (execd from the init container, the node's execd). execd's cap
// itself is tested on Docker (lifecycle/docker ptycap_test.go).
func TestCreateMaxPTYSessions(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	for _, c := range []struct {
		name, claim, execd string
	}{
		{"pty1", "", "/opt/airlock-execd/execd"},
		{"pty2", "airlock-execd", kube.NodeExecdPath},
	} {
		rt := w.runtime(t, func(cfg *kube.Config) { cfg.MaxPTYSessions, cfg.ExecdClaim = 3, c.claim })
		if _, err := rt.Create(ctx, lifecycle.Spec{SandboxID: c.name, Image: "debian:12", Entrypoint: []string{"sleep", "inf"}}); err != nil {
			t.Fatal(err)
		}
		pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-"+c.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cmd := pod.Spec.Containers[0].Command; !slices.Equal(cmd, []string{c.execd, "--exec", "--max-pty-sessions", "3", "--", "sleep", "inf"}) {
			t.Errorf("%s (claim %q): command %q", c.name, c.claim, cmd)
		}
	}
}

// TestCreateBadInput: each is refused with its error and leaves nothing behind.
func TestCreateBadInput(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) { c.AllowedHostRoots = []string{"/srv/airlock"} })
	noRoots := w.runtime(t, nil)
	host := func(p string) []lifecycle.Volume {
		return []lifecycle.Volume{{Name: "h", Host: &lifecycle.HostVolume{Path: p}, MountPath: "/mnt"}}
	}
	cases := []struct {
		name string
		rt   *kube.Runtime
		edit func(*lifecycle.Spec)
		want error
	}{
		{"host_path_outside_roots", rt, func(s *lifecycle.Spec) { s.Volumes = host("/etc") }, lifecycle.ErrInvalidVolume},
		{"host_path_escapes_root", rt, func(s *lifecycle.Spec) { s.Volumes = host("/srv/airlock/../../etc") }, lifecycle.ErrInvalidVolume},
		{"host_path_prefix_not_root", rt, func(s *lifecycle.Spec) { s.Volumes = host("/srv/airlock-other") }, lifecycle.ErrInvalidVolume},
		{"host_path_relative", rt, func(s *lifecycle.Spec) { s.Volumes = host("srv/airlock/x") }, lifecycle.ErrInvalidVolume},
		{"host_paths_disabled", noRoots, func(s *lifecycle.Spec) { s.Volumes = host("/srv/airlock/x") }, lifecycle.ErrInvalidVolume},
		{"subpath_escapes", rt, func(s *lifecycle.Spec) { s.Volumes = host("/srv/airlock"); s.Volumes[0].SubPath = "../x" }, lifecycle.ErrInvalidVolume},
		{"no_backend", rt, func(s *lifecycle.Spec) { s.Volumes = []lifecycle.Volume{{Name: "x", MountPath: "/x"}} }, lifecycle.ErrInvalidVolume},
		{"negative_cpu", rt, func(s *lifecycle.Spec) { s.NanoCPUs = -1 }, lifecycle.ErrInvalidResources},
		{"windows", rt, func(s *lifecycle.Spec) { s.Platform = &lifecycle.PlatformSpec{OS: "windows"} }, lifecycle.ErrInvalidRequest},
		{"bad_id", rt, func(s *lifecycle.Spec) { s.SandboxID = "Not_A_Label" }, lifecycle.ErrInvalidRequest},
		{"no_entrypoint", rt, func(s *lifecycle.Spec) { s.Entrypoint = nil }, lifecycle.ErrInvalidRequest},
		// Refused by the API server after the NetworkPolicy exists: it is removed again.
		{"rejected_by_api_server", rt, func(s *lifecycle.Spec) { s.Env = map[string]string{"A=B": "x"} }, lifecycle.ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := lifecycle.Spec{SandboxID: "bad1", Image: "debian:12", Entrypoint: []string{"true"},
				ImageAuth: &lifecycle.ImageAuth{Username: "u", Password: testPassword}}
			tc.edit(&spec)
			_, err := tc.rt.Create(t.Context(), spec)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), testPassword) {
				t.Error("the password is in the error")
			}
			if n, names := w.objects(t); n != 0 {
				t.Errorf("left behind: %v", names)
			}
		})
	}
}

// TestInspectAndList follows a pod through the phases a kubelet reports and lists by
// instance label.
func TestInspectAndList(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	other := w.runtime(t, func(c *kube.Config) { c.Instance = "inst-b" })
	ctx := t.Context()
	for _, id := range []string{"i1", "i2"} {
		if _, err := rt.Create(ctx, lifecycle.Spec{SandboxID: id, Image: "debian:12", Entrypoint: []string{"sleep", "inf"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Create(ctx, lifecycle.Spec{SandboxID: "o1", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}}); err != nil {
		t.Fatal(err)
	}

	in, err := rt.Inspect(ctx, "sbx-i1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Phase != lifecycle.PhaseCreated || in.Address.IsValid() || in.Node != "" || in.SandboxID != "i1" || in.ContainerID != "sbx-i1" {
		t.Errorf("pending pod: %+v", in)
	}
	if err := w.env.SetPodRunning(ctx, w.ns, "sbx-i1", "node-a", "10.244.1.7"); err != nil {
		t.Fatal(err)
	}
	in, err = rt.Inspect(ctx, "sbx-i1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Phase != lifecycle.PhaseRunning || in.Address != netip.MustParseAddr("10.244.1.7") || in.Address6.IsValid() || in.Node != "node-a" {
		t.Errorf("running pod: %+v", in)
	}

	// Dual stack: podIPs carry both families.
	pods := w.env.Client.CoreV1().Pods(w.ns)
	pod, err := pods.Get(ctx, "sbx-i1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00:10:244::7"}}
	if pod, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if in, _ = rt.Inspect(ctx, "sbx-i1"); in.Address6 != netip.MustParseAddr("fd00:10:244::7") || in.Address != netip.MustParseAddr("10.244.1.7") {
		t.Errorf("dual-stack pod: %+v", in)
	}

	// The entrypoint exited.
	pod.Status.Phase = corev1.PodFailed
	if _, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if in, _ = rt.Inspect(ctx, "sbx-i1"); in.Phase != lifecycle.PhaseExited || in.Address.IsValid() {
		t.Errorf("failed pod: %+v", in)
	}

	if _, err := rt.Inspect(ctx, "sbx-missing"); !errors.Is(err, lifecycle.ErrInstanceGone) {
		t.Errorf("missing pod: %v", err)
	}

	list, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range list {
		ids = append(ids, in.SandboxID+"="+string(in.Phase))
	}
	if want := []string{"i1=exited", "i2=created"}; !slices.Equal(ids, want) {
		t.Errorf("list %q, want %q", ids, want)
	}
	if list, err = other.List(ctx); err != nil || len(list) != 1 || list[0].SandboxID != "o1" {
		t.Errorf("other instance's list %+v %v", list, err)
	}
}

// TestRemove deletes every object; a second Remove is fine.
func TestRemove(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) { c.AllowedHostRoots = []string{"/srv/airlock"} })
	ctx := t.Context()
	inst, err := rt.Create(ctx, fullSpec("rm1"))
	if err != nil {
		t.Fatal(err)
	}
	if n, names := w.objects(t); n != 3 {
		t.Fatalf("objects %v, want pod, NetworkPolicy and Secret", names)
	}
	if err := w.env.SetPodRunning(ctx, w.ns, "sbx-rm1", "node-a", "10.244.1.9"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if n, names := w.objects(t); n != 0 {
		t.Errorf("left after Remove: %v", names)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := rt.Inspect(ctx, inst.ContainerID); !errors.Is(err, lifecycle.ErrInstanceGone) {
		t.Errorf("Inspect after Remove: %v", err)
	}
}

// TestUpdateEgress rewrites the NetworkPolicy for each shape of egress and keeps its
// owner; a NetworkPolicy deleted by hand comes back.
func TestUpdateEgress(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, func(c *kube.Config) {
		c.DNS = []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("fd00::53")}
		c.SystemNamespace = "control"
	})
	ctx := t.Context()
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "eg1", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-eg1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nps := w.env.Client.NetworkingV1().NetworkPolicies(w.ns)
	dns := []string{"53: 169.254.20.10/32", "53: fd00::53/128"}
	cases := []struct {
		name string
		eg   lifecycle.Egress
		want []string
	}{
		{"deny_all", lifecycle.Egress{}, dns},
		{"cidrs", lifecycle.Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::1/128")}},
			append(slices.Clone(dns), "*: 203.0.113.0/24", "*: 2001:db8::1/128")},
		{"by_name", lifecycle.Egress{ByName: true, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")}},
			append(slices.Clone(dns),
				"*: 0.0.0.0/0 except 10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,169.254.0.0/16,127.0.0.0/8",
				"*: ::/0 except fc00::/7,fe80::/10,::1/128",
				"*: 10.1.2.0/24")},
		{"allow_all", lifecycle.Egress{AllowAll: true, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")}}, append(slices.Clone(dns), "*: any")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := rt.UpdateEgress(ctx, inst, tc.eg); err != nil {
				t.Fatal(err)
			}
			np, err := nps.Get(ctx, "sbx-eg1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := egressPeers(np); !slices.Equal(got, tc.want) {
				t.Errorf("egress %q\nwant %q", got, tc.want)
			}
			checkIngress(t, np, "control")
			ownedByPod(t, np.OwnerReferences, pod)
		})
	}
	if err := nps.Delete(ctx, "sbx-eg1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.UpdateEgress(ctx, inst, lifecycle.Egress{}); err != nil {
		t.Fatal(err)
	}
	if np, err := nps.Get(ctx, "sbx-eg1", metav1.GetOptions{}); err != nil || !slices.Equal(egressPeers(np), dns) {
		t.Errorf("recreated NetworkPolicy: %v", err)
	}
}

// TestPauseNotImplemented: without snapshots, a 501 through lifecycle's error mapping,
// which lifecycle asks for first (lifecycle.PauseChecker), naming the alternative.
func TestPauseNotImplemented(t *testing.T) {
	rt, err := kube.New(kube.Config{Client: fake.NewClientset(), Namespace: "x", Instance: "i"})
	if err != nil {
		t.Fatal(err)
	}
	var pc lifecycle.PauseChecker = rt
	for name, f := range map[string]func(context.Context, string) error{"pause": rt.Pause, "resume": rt.Resume,
		"CanPause": func(context.Context, string) error { return pc.CanPause() }} {
		err := f(t.Context(), "sbx-x")
		if !errors.Is(err, lifecycle.ErrNotImplemented) || !strings.Contains(err.Error(), "need snapshots") ||
			!strings.Contains(err.Error(), "renew-expiration") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if rt.Kind() != "kubernetes" {
		t.Errorf("kind %q", rt.Kind())
	}
}

// TestDroppedCapabilities: the same list as the Docker runtime's.
func TestDroppedCapabilities(t *testing.T) {
	var got []string
	for _, c := range kube.DroppedCapabilities {
		got = append(got, string(c))
	}
	if !slices.Equal(got, docker.DroppedCapabilities) {
		t.Errorf("kube drops %v, docker %v", got, docker.DroppedCapabilities)
	}
}

func TestNewConfig(t *testing.T) {
	cs := fake.NewClientset()
	cases := []struct {
		name string
		cfg  kube.Config
		want string
	}{
		{"no_client", kube.Config{Namespace: "n", Instance: "i"}, "required"},
		{"no_namespace", kube.Config{Client: cs, Instance: "i"}, "required"},
		{"no_instance", kube.Config{Client: cs, Namespace: "n"}, "required"},
		{"unknown_provider", kube.Config{Client: cs, Namespace: "n", Instance: "i", Provider: "vm"}, "provider"},
		{"agent_sandbox_without_dynamic", kube.Config{Client: cs, Namespace: "n", Instance: "i", Provider: kube.ProviderAgentSandbox}, "dynamic"},
		{"relative_root", kube.Config{Client: cs, Namespace: "n", Instance: "i", AllowedHostRoots: []string{"srv"}}, "absolute"},
		{"bad_port", kube.Config{Client: cs, Namespace: "n", Instance: "i", ExecdPort: 70000}, "port"},
		{"invalid_dns", kube.Config{Client: cs, Namespace: "n", Instance: "i", DNS: []netip.Addr{{}}}, "DNS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := kube.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCreateExecdToken: the sandbox's execd token goes into a Secret of its own (owned
// by the pod, removed with it), read only by the execd init container through its
// environment, which writes it for execd --access-token-file; the pod spec never holds
// the token itself, and the sandbox container neither has it in its environment nor
// mounts the Secret.
func TestCreateExecdToken(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	ctx := t.Context()
	const tok = "tok-0123456789abcdefghijklmnopqrstuvwxyzABCD"
	inst, err := rt.Create(ctx, lifecycle.Spec{SandboxID: "tok1", Image: "debian:12", Entrypoint: []string{"sleep", "inf"}, Hold: true, ExecdToken: tok})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := w.env.Client.CoreV1().Pods(w.ns).Get(ctx, "sbx-tok1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(pod); strings.Contains(string(b), tok) {
		t.Fatalf("the pod spec holds the token")
	}
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{kube.ExecdPath, "--exec", "--hold", "--access-token-file", kube.ExecdTokenPath, "--", "sleep", "inf"}) {
		t.Errorf("command %q", c.Command)
	}
	if len(c.Env) != 0 {
		t.Errorf("sandbox container env %v", c.Env)
	}
	ic := pod.Spec.InitContainers[0]
	if !slices.Contains(ic.Command, "--install-token") || len(ic.Env) != 1 || ic.Env[0].ValueFrom == nil || ic.Env[0].ValueFrom.SecretKeyRef == nil ||
		ic.Env[0].ValueFrom.SecretKeyRef.Name != kube.ExecdTokenSecretName("tok1") {
		t.Errorf("init container %q env %+v", ic.Command, ic.Env)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			t.Errorf("the pod mounts a Secret: %+v", v)
		}
	}
	sec, err := w.env.Client.CoreV1().Secrets(w.ns).Get(ctx, kube.ExecdTokenSecretName("tok1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data[kube.ExecdTokenKey]) != tok || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
		t.Errorf("execd token Secret %+v", sec)
	}
	if err := rt.Remove(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if _, err := w.env.Client.CoreV1().Secrets(w.ns).Get(ctx, kube.ExecdTokenSecretName("tok1"), metav1.GetOptions{}); err == nil {
		t.Errorf("the execd token Secret outlives its sandbox")
	}
}
