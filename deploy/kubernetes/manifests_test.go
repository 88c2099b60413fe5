package manifests_test

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/airlockdev/airlock/internal/kubetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	os.Exit(code)
}

// layout is what one kustomization must produce.
type layout struct {
	dir            string
	system         string // namespace of the components and the state
	sandboxes      string // namespace of the sandbox pods
	tokens         string // namespace of the access-token Secrets (lifecycle --token-namespace)
	runtimeClass   string // lifecycle --runtime-class
	extraObjects   []string
	namespaceCount int
	gatewayService corev1.ServiceType // default LoadBalancer
	egressdAudit   string             // egressd's audit hostPath; default /var/lib/airlock
	containerd     string             // the node containerd's folder (egressd's hostPath); default /run/containerd
	gatewayAudit   string             // the gateway's audit hostPath (per pod: <pod name>/audit); default an emptyDir
	lifecycleAudit string             // lifecycle's audit hostPath (per pod: <pod name>/audit); default an emptyDir
	deny           []string           // lifecycle's --deny (and egressd's)
	// execdNode is the node's execd folder (lifecycle --execd-claim): a hostPath that
	// egressd's init container alone mounts (it installs execd there) and the
	// PersistentVolume airlock-execd names; empty: sandbox pods copy execd in.
	execdNode string
}

var layouts = []layout{
	{dir: "base", system: "airlock-system", sandboxes: "airlock-sandboxes", tokens: "airlock-tokens", namespaceCount: 3},
	{dir: "overlays/single-namespace", system: "airlock", sandboxes: "airlock-sandboxes", tokens: "airlock-tokens", namespaceCount: 3},
	{dir: "overlays/gvisor", system: "airlock-system", sandboxes: "airlock-sandboxes", tokens: "airlock-tokens", runtimeClass: "gvisor",
		extraObjects: []string{"RuntimeClass//gvisor"}, namespaceCount: 3},
	{dir: "overlays/testnode", system: "airlock-system", sandboxes: "airlock-sandboxes", tokens: "airlock-tokens",
		extraObjects: []string{"Service/airlock-system/airlock-lifecycle-nodeport", "PersistentVolume//airlock-execd",
			"PersistentVolumeClaim/airlock-sandboxes/airlock-execd"}, namespaceCount: 3,
		gatewayService: corev1.ServiceTypeNodePort, egressdAudit: "/var/lib/airlock-kube/egressd",
		containerd:   "/run/airlock-kube/containerd",
		gatewayAudit: "/var/lib/airlock-kube/gateway", lifecycleAudit: "/var/lib/airlock-kube/lifecycle", deny: []string{"10.244.0.0/24", "10.96.0.0/16"},
		execdNode: "/var/lib/airlock-kube/execd"},
}

// manifest is one rendered kustomization.
type manifest struct {
	objs []*unstructured.Unstructured
}

// render builds the kustomization in dir with kustomize's Go API (what kubectl
// apply -k runs).
func render(t *testing.T, dir string) *manifest {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m := &manifest{}
	for _, r := range rm.Resources() {
		obj, err := r.Map()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		m.objs = append(m.objs, &unstructured.Unstructured{Object: obj})
	}
	return m
}

// key is "Kind/namespace/name" ("Kind//name" for cluster-scoped objects).
func key(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

func (m *manifest) find(kind, ns, name string) *unstructured.Unstructured {
	for _, o := range m.objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}

func (m *manifest) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range m.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// typed converts a rendered object into its Go type (Deployment, Role, …).
func typed[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	if o == nil {
		t.Fatalf("missing object of type %T", *new(T))
	}
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, v, true); err != nil {
		t.Fatalf("%s: %v", key(o), err)
	}
	return v
}

// configMapValue resolves a configMapKeyRef against the rendered ConfigMaps (whose
// names carry kustomize's hash suffix, which the reference names too).
func (m *manifest) configMapValue(t *testing.T, ns string, ref *corev1.ConfigMapKeySelector) string {
	t.Helper()
	cm := m.find("ConfigMap", ns, ref.Name)
	if cm == nil {
		t.Fatalf("configMapKeyRef to %s/%s: no such ConfigMap rendered", ns, ref.Name)
	}
	v, ok, _ := unstructured.NestedString(cm.Object, "data", ref.Key)
	if !ok && (ref.Optional == nil || !*ref.Optional) {
		t.Fatalf("configMapKeyRef %s/%s: no key %s", ns, ref.Name, ref.Key)
	}
	return v
}

// args is container c's arguments with $(VAR) expanded as the kubelet does, from its
// env: fieldRefs as a pod on node "node-a" (10.0.0.1) in namespace ns would see them,
// ConfigMap keys from the rendered ConfigMaps, Secret keys as "<secret>".
func (m *manifest) args(t *testing.T, ns string, c corev1.Container) []string {
	t.Helper()
	var pairs []string
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil {
			switch {
			case f.FieldRef != nil:
				v = map[string]string{"metadata.namespace": ns, "metadata.name": "pod-1",
					"spec.nodeName": "node-a", "status.hostIP": "10.0.0.1"}[f.FieldRef.FieldPath]
			case f.ConfigMapKeyRef != nil:
				v = m.configMapValue(t, ns, f.ConfigMapKeyRef)
			case f.SecretKeyRef != nil:
				v = "<secret>"
			}
		}
		pairs = append(pairs, "$("+e.Name+")", v)
	}
	r := strings.NewReplacer(pairs...)
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = r.Replace(a)
		if strings.Contains(out[i], "$(") {
			t.Errorf("container %s: argument %q refers to an undefined variable", c.Name, a)
		}
	}
	return out
}

func wantArgs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: missing argument %q in %q", what, w, got)
		}
	}
}

// TestRender checks each kustomization's objects and the settings each component
// effectively runs with.
func TestRender(t *testing.T) {
	for _, l := range layouts {
		t.Run(filepath.Base(l.dir), func(t *testing.T) {
			m := render(t, l.dir)
			sys, sbx, tok := l.system, l.sandboxes, l.tokens
			want := []string{
				"CustomResourceDefinition//sandboxes.airlock.dev",
				"CustomResourceDefinition//policies.airlock.dev",
				"Namespace//" + sys, "Namespace//" + sbx, "Namespace//" + tok,
				"Role/" + tok + "/airlock-lifecycle-tokens",
				"RoleBinding/" + tok + "/airlock-lifecycle-tokens",
				"ServiceAccount/" + sys + "/airlock-lifecycle",
				"ServiceAccount/" + sys + "/airlock-gateway",
				"ServiceAccount/" + sys + "/airlock-egressd",
				"Role/" + sys + "/airlock-lifecycle",
				"RoleBinding/" + sys + "/airlock-lifecycle",
				"Role/" + sbx + "/airlock-lifecycle-sandboxes",
				"RoleBinding/" + sbx + "/airlock-lifecycle-sandboxes",
				"Deployment/" + sys + "/airlock-lifecycle",
				"Deployment/" + sys + "/airlock-gateway",
				"DaemonSet/" + sys + "/airlock-egressd",
				"Service/" + sys + "/airlock-lifecycle",
				"Service/" + sys + "/airlock-gateway",
				"PodDisruptionBudget/" + sys + "/airlock-lifecycle",
				"PodDisruptionBudget/" + sys + "/airlock-gateway",
			}
			want = append(want, l.extraObjects...)
			var have []string
			for _, o := range m.objs {
				have = append(have, key(o))
			}
			for _, w := range want {
				if !slices.Contains(have, w) {
					t.Errorf("missing %s; rendered %v", w, have)
				}
			}
			if n := len(m.ofKind("Namespace")); n != l.namespaceCount {
				t.Errorf("%d Namespaces, want %d", n, l.namespaceCount)
			}
			if len(m.ofKind("Secret")) != 0 {
				t.Error("a Secret is rendered: secrets are created by the operator (README), never committed")
			}
			for _, o := range m.objs {
				if ns := o.GetNamespace(); ns != "" && ns != sys && ns != sbx && ns != tok {
					t.Errorf("%s: namespace %q outside the layout's", key(o), ns)
				}
			}
			checkRBAC(t, m)
			checkNamespaces(t, m, l)
			checkLifecycle(t, m, l)
			checkGateway(t, m, l)
			checkEgressd(t, m, l)
			if l.runtimeClass != "" {
				rc := m.find("RuntimeClass", "", l.runtimeClass)
				if h, _, _ := unstructured.NestedString(rc.Object, "handler"); h != "runsc" {
					t.Errorf("RuntimeClass %s handler %q, want runsc", l.runtimeClass, h)
				}
			}
		})
	}
}

// checkNamespaces: sandbox pods run where Pod Security enforces "baseline" (never the
// "privileged" level egressd needs), in every layout, and apart from the system
// namespace; the access-token Secrets are apart from the system namespace (and its API
// key Secret) too.
func checkNamespaces(t *testing.T, m *manifest, l layout) {
	t.Helper()
	enforce := func(ns string) string {
		o := m.find("Namespace", "", ns)
		if o == nil {
			t.Errorf("no Namespace %s rendered", ns)
			return ""
		}
		return o.GetLabels()["pod-security.kubernetes.io/enforce"]
	}
	if got := enforce(l.sandboxes); got != "baseline" {
		t.Errorf("sandbox namespace %s enforces Pod Security %q, want baseline", l.sandboxes, got)
	}
	if l.sandboxes == l.system || l.tokens == l.system {
		t.Errorf("sandboxes in %s, tokens in %s: both must be apart from the system namespace %s", l.sandboxes, l.tokens, l.system)
	}
	if got := enforce(l.tokens); got != "restricted" {
		t.Errorf("token namespace %s enforces Pod Security %q, want restricted (no pod runs there)", l.tokens, got)
	}
}

// checkRBAC: only namespaced Roles, nothing cluster-wide, no wildcards, and every
// binding names an existing Role and ServiceAccount.
func checkRBAC(t *testing.T, m *manifest) {
	t.Helper()
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
		for _, o := range m.ofKind(kind) {
			t.Errorf("%s: no component needs cluster-wide access", key(o))
		}
	}
	for _, o := range m.ofKind("Role") {
		r := typed[rbacv1.Role](t, o)
		for _, rule := range r.Rules {
			for _, s := range slices.Concat(rule.Verbs, rule.Resources, rule.APIGroups) {
				if strings.Contains(s, "*") {
					t.Errorf("Role %s/%s: wildcard %q in %+v", r.Namespace, r.Name, s, rule)
				}
			}
		}
	}
	for _, o := range m.ofKind("RoleBinding") {
		b := typed[rbacv1.RoleBinding](t, o)
		if b.RoleRef.Kind != "Role" || m.find("Role", b.Namespace, b.RoleRef.Name) == nil {
			t.Errorf("RoleBinding %s/%s: roleRef %s %s is not a Role of the manifest", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		for _, s := range b.Subjects {
			if s.Kind != "ServiceAccount" || m.find("ServiceAccount", s.Namespace, s.Name) == nil {
				t.Errorf("RoleBinding %s/%s: subject %s %s/%s is not a ServiceAccount of the manifest", b.Namespace, b.Name, s.Kind, s.Namespace, s.Name)
			}
		}
	}
}

// checkPod: the image, resources, scrape annotations of a pod template.
func checkPod(t *testing.T, what string, tpl corev1.PodTemplateSpec, port string) {
	t.Helper()
	a := tpl.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: scrape annotations %v, want port %s path /metrics", what, a, port)
	}
	for _, c := range tpl.Spec.Containers {
		if c.Image != "airlock/airlock:0.1.0" {
			t.Errorf("%s: image %q, want airlock/airlock:0.1.0 (kustomize images)", what, c.Image)
		}
		r := c.Resources
		if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Cpu().IsZero() || r.Limits.Memory().IsZero() {
			t.Errorf("%s: container %s needs cpu and memory requests and limits: %+v", what, c.Name, r)
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: container %s must drop ALL capabilities, not be privileged nor escalate: %+v", what, c.Name, sc)
		}
	}
}

func runsAsNonRoot(p corev1.PodSpec) bool {
	return p.SecurityContext != nil && p.SecurityContext.RunAsNonRoot != nil && *p.SecurityContext.RunAsNonRoot &&
		p.SecurityContext.RunAsUser != nil && *p.SecurityContext.RunAsUser != 0
}

func checkLifecycle(t *testing.T, m *manifest, l layout) {
	t.Helper()
	d := typed[appsv1.Deployment](t, m.find("Deployment", l.system, "airlock-lifecycle"))
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("lifecycle replicas %v, want 2", d.Spec.Replicas)
	}
	p := d.Spec.Template.Spec
	checkPod(t, "lifecycle", d.Spec.Template, "8080")
	if p.ServiceAccountName != "airlock-lifecycle" || !runsAsNonRoot(p) {
		t.Errorf("lifecycle: service account %q, non-root %v", p.ServiceAccountName, runsAsNonRoot(p))
	}
	// Sandbox NetworkPolicies admit the server proxy by this label (lifecycle/kube).
	if d.Spec.Template.Labels["app.kubernetes.io/name"] != "airlock-lifecycle" {
		t.Errorf("lifecycle pods labelled %v", d.Spec.Template.Labels)
	}
	args := m.args(t, l.system, p.Containers[0])
	if args[0] != "lifecycle" {
		t.Errorf("lifecycle runs %q", args)
	}
	wantArgs(t, "lifecycle", args, "--runtime=kubernetes", "--listen=:8080",
		"--namespace="+l.sandboxes, "--system-namespace="+l.system, "--token-namespace="+l.tokens,
		"--runtime-class="+l.runtimeClass, "--dns=169.254.20.10", "--l7-port=15001", "--execd-image=airlock/execd:0.1.0",
		"--vault", "--snapshots", "--leader-service=airlock-lifecycle-leader")
	// The leader Service has no selector: the leading replica writes its endpoint.
	if svc := typed[corev1.Service](t, m.find("Service", l.system, "airlock-lifecycle-leader")); len(svc.Spec.Selector) != 0 || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "http" {
		t.Errorf("airlock-lifecycle-leader: selector %v ports %v, want no selector and port http", svc.Spec.Selector, svc.Spec.Ports)
	}
	var deny []string
	for _, a := range args {
		if d, ok := strings.CutPrefix(a, "--deny="); ok {
			deny = append(deny, d)
		}
	}
	if !slices.Equal(deny, l.deny) {
		t.Errorf("lifecycle --deny %q, want %q", deny, l.deny)
	}
	svc := typed[corev1.Service](t, m.find("Service", l.system, "airlock-lifecycle"))
	if svc.Spec.Type != corev1.ServiceTypeClusterIP || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 {
		t.Errorf("lifecycle Service: %s %+v, want ClusterIP on 8080", svc.Spec.Type, svc.Spec.Ports)
	}
	// Console sessions live in one replica's memory (cluster.ConsoleConfig).
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		t.Errorf("lifecycle Service: sessionAffinity %q, want ClientIP (console sessions are per replica)", svc.Spec.SessionAffinity)
	}
	checkReplicaAudit(t, "lifecycle", p, args, l.lifecycleAudit)
}

// checkReplicaAudit: the audit log of a Deployment's replica (what; its pod spec p and
// container 0's resolved args) and its signing key are on a volume mounted at
// /var/lib/airlock (the root filesystem is read-only; replicas never share a log): an
// emptyDir with --audit-dir=/var/lib/airlock/audit, or, with hostPath set, a folder of
// the pod's own in that node folder (/var/lib/airlock/$(POD_NAME)/audit; the last
// --audit-dir wins).
func checkReplicaAudit(t *testing.T, what string, p corev1.PodSpec, args []string, hostPath string) {
	t.Helper()
	auditDir := ""
	for _, a := range args {
		if d, ok := strings.CutPrefix(a, "--audit-dir="); ok {
			auditDir = d
		}
	}
	vol := ""
	for _, m := range p.Containers[0].VolumeMounts {
		if m.MountPath == "/var/lib/airlock" && !m.ReadOnly {
			vol = m.Name
		}
	}
	i := slices.IndexFunc(p.Volumes, func(v corev1.Volume) bool { return v.Name == vol })
	podName := slices.ContainsFunc(p.Containers[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	})
	switch {
	case vol == "" || i < 0:
		t.Errorf("%s: no writable volume at /var/lib/airlock for the audit log (%v)", what, p.Containers[0].VolumeMounts)
	case hostPath == "" && (p.Volumes[i].EmptyDir == nil || auditDir != "/var/lib/airlock/audit"):
		t.Errorf("%s: audit in %q on %+v, want /var/lib/airlock/audit on an emptyDir", what, auditDir, p.Volumes[i].VolumeSource)
	case hostPath != "" && (p.Volumes[i].HostPath == nil || p.Volumes[i].HostPath.Path != hostPath || auditDir != "/var/lib/airlock/pod-1/audit" || !podName):
		t.Errorf("%s: audit in %q on %+v, want /var/lib/airlock/$(POD_NAME)/audit on hostPath %s", what, auditDir, p.Volumes[i].VolumeSource, hostPath)
	}
}

func checkGateway(t *testing.T, m *manifest, l layout) {
	t.Helper()
	d := typed[appsv1.Deployment](t, m.find("Deployment", l.system, "airlock-gateway"))
	p := d.Spec.Template.Spec
	checkPod(t, "gateway", d.Spec.Template, "9090")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || !runsAsNonRoot(p) {
		t.Errorf("gateway: replicas %v, non-root %v", d.Spec.Replicas, runsAsNonRoot(p))
	}
	noToken(t, m, l, "airlock-gateway", p)
	if d.Spec.Template.Labels["app.kubernetes.io/name"] != "airlock-gateway" {
		t.Errorf("gateway pods labelled %v", d.Spec.Template.Labels)
	}
	args := m.args(t, l.system, p.Containers[0])
	lc := "airlock-lifecycle." + l.system + ".svc:8080"
	// The public gateway never admits the API key from clients.
	wantArgs(t, "gateway", args, "--refuse-api-key")
	// The watch from the leading replica, every replica while none leads.
	wantArgs(t, "gateway", args, "gateway", "--listen=:8081",
		"--watch-url=http://airlock-lifecycle-leader."+l.system+".svc:8080/internal/v1/watch",
		"--watch-fallback-url=http://"+lc+"/internal/v1/watch", "--egress-api="+lc,
		// The egressd of a sandbox's node names each execd command's process group.
		"--node-egressd-port=9102")
	// The audit log and its key: as lifecycle's.
	checkReplicaAudit(t, "gateway", p, args, l.gatewayAudit)
	svc := typed[corev1.Service](t, m.find("Service", l.system, "airlock-gateway"))
	wantType := cmp.Or(l.gatewayService, corev1.ServiceTypeLoadBalancer)
	if svc.Spec.Type != wantType || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.StrVal != "http" {
		t.Errorf("gateway Service: %s %+v, want %s 80 to http", svc.Spec.Type, svc.Spec.Ports, wantType)
	}
}

func checkEgressd(t *testing.T, m *manifest, l layout) {
	t.Helper()
	d := typed[appsv1.DaemonSet](t, m.find("DaemonSet", l.system, "airlock-egressd"))
	p := d.Spec.Template.Spec
	checkPod(t, "egressd", d.Spec.Template, "9102")
	noToken(t, m, l, "airlock-egressd", p)
	if !p.HostNetwork || p.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("egressd: hostNetwork %v dnsPolicy %q, want true and ClusterFirstWithHostNet", p.HostNetwork, p.DNSPolicy)
	}
	// The node's pid namespace: egressd finds each execd command's process group in
	// the node's /proc (egressd.GroupsHandler). No other host namespace.
	if !p.HostPID || p.HostIPC {
		t.Errorf("egressd: hostPID %v hostIPC %v, want true and false", p.HostPID, p.HostIPC)
	}
	c := p.Containers[0]
	caps := slices.Clone(c.SecurityContext.Capabilities.Add)
	slices.Sort(caps)
	if want := []corev1.Capability{"BPF", "NET_ADMIN", "NET_BIND_SERVICE", "PERFMON"}; !slices.Equal(caps, want) {
		t.Errorf("egressd capabilities %v, want exactly %v", caps, want)
	}
	args := m.args(t, l.system, c)
	wantArgs(t, "egressd", args, "egressd", "--node=node-a",
		"--watch-url=http://airlock-lifecycle-leader."+l.system+".svc:8080/internal/v1/watch",
		"--watch-fallback-url=http://airlock-lifecycle."+l.system+".svc:8080/internal/v1/watch",
		"--dns-local-address=169.254.20.10", "--l7-port=15001", "--audit-dir=/var/lib/airlock/audit", "--metrics-listen=[10.0.0.1]:9102",
		"--cgroup-root=/host/sys/fs/cgroup", "--vault-dir=/var/lib/airlock/vault",
		"--containerd-socket=/host/run/containerd/containerd.sock")
	host := map[string]string{}
	for _, v := range p.Volumes {
		if v.HostPath != nil {
			host[v.HostPath.Path] = v.Name
		}
	}
	ctrDir := cmp.Or(l.containerd, "/run/containerd")
	for _, path := range []string{"/sys/fs/bpf", cmp.Or(l.egressdAudit, "/var/lib/airlock"), "/sys/fs/cgroup", ctrDir} {
		if host[path] == "" {
			t.Errorf("egressd: no hostPath volume %s (%v)", path, host)
		}
	}
	want := 4
	if l.execdNode != "" {
		want++
		checkExecdNode(t, m, l, p, host[l.execdNode])
	}
	if len(host) != want {
		t.Errorf("egressd: host paths %v, want only bpffs, /var/lib/airlock (the audit directory and its key), /sys/fs/cgroup, containerd's folder and the node's execd folder when set", host)
	}
	// The node's cgroups (where the pods' cgroups are found) are only read.
	for _, m := range c.VolumeMounts {
		if m.Name == host["/sys/fs/cgroup"] && (m.MountPath != "/host/sys/fs/cgroup" || !m.ReadOnly) {
			t.Errorf("egressd: the node's /sys/fs/cgroup is mounted at %s (read-only %v), want read-only at /host/sys/fs/cgroup", m.MountPath, m.ReadOnly)
		}
		// containerd's socket (snapshots) on a read-only mount, where a socket connects.
		if m.Name == host[ctrDir] && (m.MountPath != "/host/run/containerd" || !m.ReadOnly) {
			t.Errorf("egressd: containerd's folder is mounted at %s (read-only %v), want read-only at /host/run/containerd", m.MountPath, m.ReadOnly)
		}
	}
}

// noToken: a component without Kubernetes API access gets no token at all.
func noToken(t *testing.T, m *manifest, l layout, sa string, p corev1.PodSpec) {
	t.Helper()
	a := typed[corev1.ServiceAccount](t, m.find("ServiceAccount", l.system, sa))
	if p.ServiceAccountName != sa || a.AutomountServiceAccountToken == nil || *a.AutomountServiceAccountToken ||
		p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		t.Errorf("%s: pods must run as that ServiceAccount with automountServiceAccountToken false (account and pod)", sa)
	}
}

// checkExecdNode: the node's execd folder (volume vol of egressd's pod p) is mounted by
// egressd's init container alone, which installs execd from the execd image there; the
// PersistentVolume airlock-execd names that folder (type Directory) and is bound to the
// claim airlock-execd of the sandbox namespace only, read-only; lifecycle names it.
func checkExecdNode(t *testing.T, m *manifest, l layout, p corev1.PodSpec, vol string) {
	t.Helper()
	if vol == "" {
		t.Fatalf("egressd: no hostPath volume %s", l.execdNode)
	}
	for _, c := range p.Containers {
		for _, vm := range c.VolumeMounts {
			if vm.Name == vol {
				t.Errorf("egressd container %s mounts the node's execd folder", c.Name)
			}
		}
	}
	if len(p.InitContainers) != 1 || !slices.Equal(p.InitContainers[0].Command, []string{"/execd", "--install", "/node-execd/execd"}) ||
		len(p.InitContainers[0].VolumeMounts) != 1 || p.InitContainers[0].VolumeMounts[0].Name != vol {
		t.Errorf("egressd init containers %+v, want execd --install into the node's folder", p.InitContainers)
	}
	pv := typed[corev1.PersistentVolume](t, m.find("PersistentVolume", "", "airlock-execd"))
	if pv.Spec.HostPath == nil || pv.Spec.HostPath.Path != l.execdNode || pv.Spec.HostPath.Type == nil ||
		*pv.Spec.HostPath.Type != corev1.HostPathDirectory || pv.Spec.ClaimRef == nil ||
		pv.Spec.ClaimRef.Namespace != l.sandboxes || pv.Spec.ClaimRef.Name != "airlock-execd" ||
		!slices.Equal(pv.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}) {
		t.Errorf("PersistentVolume airlock-execd %+v", pv.Spec)
	}
	d := typed[appsv1.Deployment](t, m.find("Deployment", l.system, "airlock-lifecycle"))
	if !slices.Contains(m.args(t, l.system, d.Spec.Template.Spec.Containers[0]), "--execd-claim=airlock-execd") {
		t.Errorf("lifecycle does not name the claim airlock-execd (--execd-claim)")
	}
}
