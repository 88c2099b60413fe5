// Package kube is lifecycle's Kubernetes runtime: one Pod per sandbox (or one
// kubernetes-sigs/agent-sandbox Sandbox resource owning that pod, Config.Provider), with
// execd delivered by an init container into an emptyDir and run as PID 1 wrapping the
// user's entrypoint exactly as on Docker, the pod hardened like a Docker sandbox, its
// DNS pointed at the node's egressd, and a NetworkPolicy per sandbox as a second layer
// (egressd on the node stays the enforcement of record).
//
// Readiness comes from the pod's status (Inspect: Running with an address) and then
// execd's /ping, which lifecycle polls. Pause is not available on Kubernetes.
package kube

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockdev/airlock/internal/buildinfo"
	"github.com/airlockdev/airlock/lifecycle"
)

// Labels and annotations on every object of a sandbox.
const (
	LabelSandboxID = "airlock.dev/sandbox-id"
	LabelInstance  = "airlock.dev/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AnnotationEntrypoint is the user's entrypoint as a JSON array (the container's
	// command is execd wrapping it).
	AnnotationEntrypoint = "airlock.dev/entrypoint"
	// ContainerName is the sandbox's container; InitContainerName delivers execd.
	ContainerName     = "sandbox"
	InitContainerName = "execd"
	// ExecdPath is where execd lives in the sandbox container (as on Docker).
	ExecdPath   = "/opt/airlock/execd"
	execdVolume = "airlock-execd"
)

// Providers of the sandbox workload.
const (
	ProviderPod          = "pod"
	ProviderAgentSandbox = "agent-sandbox"
)

// AgentSandboxGVR is the kubernetes-sigs/agent-sandbox Sandbox resource.
var AgentSandboxGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxes"}

// DroppedCapabilities are removed from every sandbox container (the Docker runtime's
// list: lifecycle/docker.DroppedCapabilities).
var DroppedCapabilities = []corev1.Capability{
	"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "MKNOD",
	"SYS_BOOT", "SYS_TIME", "SYS_RAWIO", "AUDIT_WRITE",
}

// Config configures the runtime.
type Config struct {
	Client kubernetes.Interface
	// Dynamic is required for the agent-sandbox provider.
	Dynamic dynamic.Interface
	// Namespace is where sandbox pods run. Required.
	Namespace string
	// Instance is the lifecycle instance id (label airlock.dev/instance): List returns
	// only pods carrying it. Required.
	Instance string
	// Provider is ProviderPod (default) or ProviderAgentSandbox.
	Provider string
	// ExecdImage carries the static execd at /execd; default airlock/execd:<version>.
	ExecdImage string
	// RuntimeClassName selects gVisor, Kata, … (empty: the cluster's default).
	RuntimeClassName string
	// DNS are the pods' resolvers: the node-local address of egressd's DNS filter
	// (dnsPolicy None). Empty leaves the cluster's DNS (ClusterFirst).
	DNS []netip.Addr
	// AllowedHostRoots are the node directories under which host-path volumes may be
	// mounted; empty disables host-path volumes.
	AllowedHostRoots []string
	// SystemNamespace and the selectors admit ingress to sandbox pods (NetworkPolicy):
	// pods labelled app.kubernetes.io/name=airlock-gateway or airlock-lifecycle in
	// SystemNamespace (default "airlock-system").
	SystemNamespace string
	// ExecdPort is execd's port, admitted from lifecycle; default 44772.
	ExecdPort int
	Log       *slog.Logger
}

// Runtime is the Kubernetes runtime; safe for concurrent use.
type Runtime struct {
	cfg Config
	log *slog.Logger
}

var (
	_ lifecycle.Runtime       = (*Runtime)(nil)
	_ lifecycle.EgressUpdater = (*Runtime)(nil)
)

// New checks cfg; it performs no I/O.
func New(cfg Config) (*Runtime, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Instance == "" {
		return nil, errors.New("kube: Client, Namespace and Instance are required")
	}
	switch cfg.Provider {
	case "":
		cfg.Provider = ProviderPod
	case ProviderPod:
	case ProviderAgentSandbox:
		if cfg.Dynamic == nil {
			return nil, errors.New("kube: the agent-sandbox provider needs a dynamic client")
		}
	default:
		return nil, fmt.Errorf("kube: provider %q: want %s or %s", cfg.Provider, ProviderPod, ProviderAgentSandbox)
	}
	if cfg.ExecdImage == "" {
		cfg.ExecdImage = "airlock/execd:" + buildinfo.Version
	}
	if cfg.SystemNamespace == "" {
		cfg.SystemNamespace = "airlock-system"
	}
	if cfg.ExecdPort == 0 {
		cfg.ExecdPort = lifecycle.DefaultExecdPort
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, r := range cfg.AllowedHostRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("kube: allowed host root %q is not absolute", r)
		}
	}
	return &Runtime{cfg: cfg, log: cfg.Log}, nil
}

// Kind is "kubernetes".
func (r *Runtime) Kind() string { return "kubernetes" }

// PodName is the pod (and NetworkPolicy, agent-sandbox Sandbox) name of sandbox id.
func PodName(id string) string { return "sbx-" + id }

func pullSecretName(id string) string { return PodName(id) + "-pull" }

// Create makes the sandbox's objects: the image pull Secret (when the request carries
// image auth), the NetworkPolicy (first, so the pod never runs without it), then the
// pod or agent-sandbox Sandbox. It returns once they exist: the pod has no address
// until it is scheduled and runs (lifecycle asks Inspect). On error every object made
// is deleted.
func (r *Runtime) Create(ctx context.Context, spec lifecycle.Spec) (inst lifecycle.Instance, err error) {
	if len(spec.TrustedCAPEM) > 0 {
		return inst, fmt.Errorf("%w: credentialProxy is not available on the Kubernetes runtime", lifecycle.ErrInvalidRequest)
	}
	if spec.Platform != nil && spec.Platform.OS != "" && spec.Platform.OS != "linux" {
		return inst, fmt.Errorf("%w: platform %s/%s: this runtime runs linux pods", lifecycle.ErrInvalidRequest, spec.Platform.OS, spec.Platform.Arch)
	}
	pod, err := r.podFor(spec)
	if err != nil {
		return inst, err
	}
	name := PodName(spec.SandboxID)
	defer func() {
		if err != nil {
			r.removeObjects(context.WithoutCancel(ctx), spec.SandboxID)
		}
	}()
	if _, err = r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Create(ctx,
		r.networkPolicy(spec.SandboxID, spec.Egress), metav1.CreateOptions{}); err != nil {
		return inst, fmt.Errorf("kube: creating the NetworkPolicy of %s: %w", spec.SandboxID, err)
	}
	if spec.ImageAuth != nil {
		sec, err := pullSecret(r.cfg.Namespace, spec)
		if err != nil {
			return inst, err
		}
		if _, err = r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return inst, fmt.Errorf("kube: creating the image pull Secret of %s: %w", spec.SandboxID, err)
		}
		pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: sec.Name}}
	}
	switch r.cfg.Provider {
	case ProviderAgentSandbox:
		err = r.createAgentSandbox(ctx, pod)
	default:
		_, err = r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	}
	if err != nil {
		if apierrors.IsInvalid(err) {
			return inst, fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
		}
		return inst, fmt.Errorf("kube: creating the pod of %s: %w", spec.SandboxID, err)
	}
	return lifecycle.Instance{SandboxID: spec.SandboxID, ContainerID: name, Phase: lifecycle.PhaseCreated}, nil
}

// podFor builds the sandbox's pod; bad volumes and limits are errors wrapping
// lifecycle.ErrInvalidVolume and ErrInvalidResources.
func (r *Runtime) podFor(spec lifecycle.Spec) (*corev1.Pod, error) {
	entry, err := json.Marshal(spec.Entrypoint)
	if err != nil {
		return nil, err
	}
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	res, err := resources(spec)
	if err != nil {
		return nil, err
	}
	vols, mounts, err := r.volumes(spec.Volumes)
	if err != nil {
		return nil, err
	}
	cmd := []string{ExecdPath, "--exec"}
	if spec.Hold {
		cmd = append(cmd, "--hold")
	}
	cmd = append(append(cmd, "--"), spec.Entrypoint...)
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(spec.SandboxID),
			Namespace:   r.cfg.Namespace,
			Labels:      r.labels(spec.SandboxID),
			Annotations: map[string]string{AnnotationEntrypoint: string(entry)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:            InitContainerName,
				Image:           r.cfg.ExecdImage,
				Command:         []string{"/execd", "--install", ExecdPath},
				VolumeMounts:    []corev1.VolumeMount{{Name: execdVolume, MountPath: filepath.Dir(ExecdPath)}},
				SecurityContext: hardened(),
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           spec.Image,
				Command:         cmd,
				Env:             env,
				Resources:       res,
				VolumeMounts:    append([]corev1.VolumeMount{{Name: execdVolume, MountPath: filepath.Dir(ExecdPath), ReadOnly: true}}, mounts...),
				SecurityContext: hardened(),
			}},
			Volumes: append([]corev1.Volume{{Name: execdVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}, vols...),
		},
	}
	if r.cfg.RuntimeClassName != "" {
		rc := r.cfg.RuntimeClassName
		pod.Spec.RuntimeClassName = &rc
	}
	if len(r.cfg.DNS) > 0 {
		pod.Spec.DNSPolicy = corev1.DNSNone
		dc := &corev1.PodDNSConfig{}
		for _, a := range r.cfg.DNS {
			dc.Nameservers = append(dc.Nameservers, a.String())
		}
		pod.Spec.DNSConfig = dc
	}
	return pod, nil
}

// hardened is the container security context: not privileged, no privilege
// escalation, the Docker runtime's capabilities dropped, seccomp RuntimeDefault.
func hardened() *corev1.SecurityContext {
	no := false
	return &corev1.SecurityContext{
		Privileged:               &no,
		AllowPrivilegeEscalation: &no,
		Capabilities:             &corev1.Capabilities{Drop: slices.Clone(DroppedCapabilities)},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// resources maps the spec's limits to requests and limits (requests = limits: the
// sandbox gets what it asked for). Kubernetes has no per-pod pids limit: the node's
// kubelet sets it (podPidsLimit).
func resources(spec lifecycle.Spec) (corev1.ResourceRequirements, error) {
	rl := corev1.ResourceList{}
	if spec.NanoCPUs < 0 || spec.MemoryBytes < 0 {
		return corev1.ResourceRequirements{}, fmt.Errorf("%w: negative limit", lifecycle.ErrInvalidResources)
	}
	if spec.NanoCPUs > 0 {
		rl[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(spec.NanoCPUs/1e6, 1), resource.DecimalSI)
	}
	if spec.MemoryBytes > 0 {
		rl[corev1.ResourceMemory] = *resource.NewQuantity(spec.MemoryBytes, resource.BinarySI)
	}
	if len(rl) == 0 {
		return corev1.ResourceRequirements{}, nil
	}
	return corev1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}, nil
}

// volumes maps the create request's volumes: a PVC by claim name, a host path only
// under an allowed root.
func (r *Runtime) volumes(in []lifecycle.Volume) ([]corev1.Volume, []corev1.VolumeMount, error) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	for i, v := range in {
		name := fmt.Sprintf("vol-%d", i)
		var src corev1.VolumeSource
		switch {
		case v.PVC != nil:
			if v.PVC.ClaimName == "" {
				return nil, nil, fmt.Errorf("%w: volume %q: pvc.claimName is empty", lifecycle.ErrInvalidVolume, v.Name)
			}
			src.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.PVC.ClaimName, ReadOnly: v.ReadOnly}
		case v.Host != nil:
			p, err := r.hostPath(v.Name, v.Host.Path)
			if err != nil {
				return nil, nil, err
			}
			dir := corev1.HostPathDirectory
			src.HostPath = &corev1.HostPathVolumeSource{Path: p, Type: &dir}
		default:
			return nil, nil, fmt.Errorf("%w: volume %q: only pvc and host volumes are supported", lifecycle.ErrInvalidVolume, v.Name)
		}
		if !filepath.IsAbs(v.MountPath) {
			return nil, nil, fmt.Errorf("%w: volume %q: mountPath %q is not absolute", lifecycle.ErrInvalidVolume, v.Name, v.MountPath)
		}
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: src})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: v.MountPath, ReadOnly: v.ReadOnly, SubPath: v.SubPath})
	}
	return vols, mounts, nil
}

// hostPath checks that p (cleaned; the node's symlinks cannot be resolved from here)
// lies under an allowed root.
func (r *Runtime) hostPath(name, p string) (string, error) {
	if len(r.cfg.AllowedHostRoots) == 0 {
		return "", fmt.Errorf("%w: volume %q: host-path volumes are disabled on this server", lifecycle.ErrInvalidVolume, name)
	}
	c := filepath.Clean(p)
	if !filepath.IsAbs(c) {
		return "", fmt.Errorf("%w: volume %q: host path %q is not absolute", lifecycle.ErrInvalidVolume, name, p)
	}
	for _, root := range r.cfg.AllowedHostRoots {
		rel, err := filepath.Rel(filepath.Clean(root), c)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: volume %q: host path %s is not under an allowed root (%s)", lifecycle.ErrInvalidVolume,
		name, p, strings.Join(r.cfg.AllowedHostRoots, ", "))
}

func (r *Runtime) labels(id string) map[string]string {
	return map[string]string{LabelSandboxID: id, LabelInstance: r.cfg.Instance, LabelManagedBy: "airlock"}
}

// pullSecret is a kubernetes.io/dockerconfigjson Secret for the image's registry.
func pullSecret(ns string, spec lifecycle.Spec) (*corev1.Secret, error) {
	registry := "https://index.docker.io/v1/"
	if first, _, ok := strings.Cut(spec.Image, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		registry = first
	}
	a := spec.ImageAuth
	cfg := map[string]any{"auths": map[string]any{registry: map[string]string{
		"username": a.Username, "password": a.Password,
		"auth": base64.StdEncoding.EncodeToString([]byte(a.Username + ":" + a.Password)),
	}}}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pullSecretName(spec.SandboxID), Namespace: ns,
			Labels: map[string]string{LabelSandboxID: spec.SandboxID, LabelManagedBy: "airlock"}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: b},
	}, nil
}

// nonPublic are the prefixes a by-name allow does not open in the NetworkPolicy (the
// cluster's and the node's own networks stay closed; egressd decides names).
var nonPublic = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"}
var nonPublic6 = []string{"fc00::/7", "fe80::/10", "::1/128"}

// networkPolicy admits ingress from the gateway and lifecycle pods only, and egress to
// the DNS addresses (port 53) plus what eg allows.
func (r *Runtime) networkPolicy(id string, eg lifecycle.Egress) *networkingv1.NetworkPolicy {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	from := func(name string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": r.cfg.SystemNamespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": name}},
		}
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PodName(id), Namespace: r.cfg.Namespace, Labels: r.labels(id)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandboxID: id}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{from("airlock-gateway"), from("airlock-lifecycle")}}},
		},
	}
	var dnsPeers []networkingv1.NetworkPolicyPeer
	for _, a := range r.cfg.DNS {
		dnsPeers = append(dnsPeers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}})
	}
	if len(dnsPeers) > 0 {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    dnsPeers,
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
		})
	}
	switch {
	case eg.AllowAll:
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
	case eg.ByName:
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: nonPublic}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: nonPublic6}},
		}})
	}
	if !eg.AllowAll && len(eg.CIDRs) > 0 {
		var peers []networkingv1.NetworkPolicyPeer
		for _, p := range eg.CIDRs {
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.Masked().String()}})
		}
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers})
	}
	return np
}

// UpdateEgress rewrites the sandbox's NetworkPolicy for eg.
func (r *Runtime) UpdateEgress(ctx context.Context, inst lifecycle.Instance, eg lifecycle.Egress) error {
	nps := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace)
	want := r.networkPolicy(inst.SandboxID, eg)
	cur, err := nps.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = nps.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	cur.Spec = want.Spec
	_, err = nps.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// createAgentSandbox creates the agent-sandbox Sandbox resource whose pod template is
// pod's (its controller creates a pod of the same name).
func (r *Runtime) createAgentSandbox(ctx context.Context, pod *corev1.Pod) error {
	tmpl, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations},
		Spec:       pod.Spec,
	})
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": AgentSandboxGVR.GroupVersion().String(),
		"kind":       "Sandbox",
		"metadata": map[string]any{
			"name": pod.Name, "namespace": pod.Namespace,
			"labels": toAny(pod.Labels), "annotations": toAny(pod.Annotations),
		},
		"spec": map[string]any{"podTemplate": tmpl},
	}}
	_, err = r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(pod.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	return err
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Remove deletes the sandbox's pod (or agent-sandbox Sandbox), NetworkPolicy and pull
// Secret; missing objects are not an error. PVCs are the user's and stay.
func (r *Runtime) Remove(ctx context.Context, inst lifecycle.Instance) error {
	return r.removeObjects(ctx, inst.SandboxID)
}

func (r *Runtime) removeObjects(ctx context.Context, id string) error {
	name := PodName(id)
	bgp := metav1.DeletePropagationBackground
	zero := int64(0)
	opts := metav1.DeleteOptions{PropagationPolicy: &bgp, GracePeriodSeconds: &zero}
	var errs []error
	keep := func(what string, err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("kube: deleting the %s of %s: %w", what, id, err))
		}
	}
	if r.cfg.Provider == ProviderAgentSandbox {
		keep("agent-sandbox Sandbox", r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(r.cfg.Namespace).Delete(ctx, name, opts))
	}
	keep("pod", r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Delete(ctx, name, opts))
	keep("NetworkPolicy", r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Delete(ctx, name, opts))
	keep("image pull Secret", r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Delete(ctx, pullSecretName(id), opts))
	return errors.Join(errs...)
}

// Pause is not available on Kubernetes (no freezer through the API).
func (r *Runtime) Pause(context.Context, string) error {
	return fmt.Errorf("%w: pause is not available on the Kubernetes runtime", lifecycle.ErrNotImplemented)
}

// Resume is not available on Kubernetes.
func (r *Runtime) Resume(context.Context, string) error {
	return fmt.Errorf("%w: resume is not available on the Kubernetes runtime", lifecycle.ErrNotImplemented)
}

// Inspect returns the pod's view: Pending → created, Running → running (with its
// addresses and node), Succeeded/Failed → exited; lifecycle.ErrInstanceGone when the
// pod does not exist (an agent-sandbox Sandbox whose pod is not created yet is
// created).
func (r *Runtime) Inspect(ctx context.Context, name string) (lifecycle.Instance, error) {
	pod, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if r.cfg.Provider == ProviderAgentSandbox {
			if sb, err2 := r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{}); err2 == nil {
				return lifecycle.Instance{SandboxID: sb.GetLabels()[LabelSandboxID], ContainerID: name, Phase: lifecycle.PhaseCreated}, nil
			}
		}
		return lifecycle.Instance{}, fmt.Errorf("%w: pod %s", lifecycle.ErrInstanceGone, name)
	}
	if err != nil {
		return lifecycle.Instance{}, fmt.Errorf("kube: reading pod %s: %w", name, err)
	}
	return instanceOf(pod), nil
}

func instanceOf(pod *corev1.Pod) lifecycle.Instance {
	in := lifecycle.Instance{SandboxID: pod.Labels[LabelSandboxID], ContainerID: pod.Name, Node: pod.Spec.NodeName}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		in.Phase = lifecycle.PhaseRunning
	case corev1.PodSucceeded, corev1.PodFailed:
		in.Phase = lifecycle.PhaseExited
	default:
		in.Phase = lifecycle.PhaseCreated
	}
	if pod.DeletionTimestamp != nil {
		in.Phase = lifecycle.PhaseExited
	}
	for _, ip := range pod.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		if a.Is4() && !in.Address.IsValid() {
			in.Address = a
		} else if a.Is6() && !in.Address6.IsValid() {
			in.Address6 = a
		}
	}
	if !in.Address.IsValid() {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil && a.Is4() {
			in.Address = a
		}
	}
	if in.Phase != lifecycle.PhaseRunning {
		in.Address, in.Address6 = netip.Addr{}, netip.Addr{}
	}
	return in
}

// List returns every pod of this lifecycle instance (label airlock.dev/instance).
func (r *Runtime) List(ctx context.Context) ([]lifecycle.Instance, error) {
	pods, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: LabelInstance + "=" + r.cfg.Instance,
	})
	if err != nil {
		return nil, fmt.Errorf("kube: listing pods: %w", err)
	}
	out := make([]lifecycle.Instance, 0, len(pods.Items))
	for i := range pods.Items {
		out = append(out, instanceOf(&pods.Items[i]))
	}
	return out, nil
}
