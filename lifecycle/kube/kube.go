// Package kube is lifecycle's Kubernetes runtime: one Pod per sandbox (or one
// kubernetes-sigs/agent-sandbox Sandbox resource owning that pod, Config.Provider), with
// execd delivered by an init container into an emptyDir and run as PID 1 wrapping the
// user's entrypoint exactly as on Docker, the pod hardened like a Docker sandbox, its
// DNS pointed at the node's egressd, and a NetworkPolicy per sandbox as a second layer
// (egressd on the node stays the enforcement of record).
//
// With Config.ExecdClaim, execd comes from the node instead (a read-only claim the
// egressd DaemonSet fills) and the pod has no init container unless it must trust
// extra CAs.
//
// Readiness comes from the pod's status (WaitRunning: a watch until Running with an
// address) and then execd's /ping, which lifecycle polls. Pause (with snapshots
// configured) commits the pod into a node-local image and deletes the pod; resume makes
// it again from that image (pause.go, lifecycle.RecreatingPauser).
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockdev/airlock/internal/buildinfo"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// Labels and annotations on every object of a sandbox.
const (
	LabelSandboxID = "airlock.dev/sandbox-id"
	LabelInstance  = "airlock.dev/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AnnotationEntrypoint is the user's entrypoint as a JSON array of strings (the
	// container's command is execd wrapping it); responses and test kubelets read it.
	AnnotationEntrypoint = "airlock.dev/entrypoint"
	// ContainerName is the sandbox's container; InitContainerName delivers execd;
	// TrustContainerName (only with Spec.TrustedCAPEM) builds the trust bundle.
	ContainerName      = "sandbox"
	InitContainerName  = "execd"
	TrustContainerName = "trust"
	// ExecdDir is execd's emptyDir in the init containers and, read-only, in the
	// sandbox container: a folder of Airlock's own that no image uses, because a
	// mount hides whatever the image has at that path (an image's /opt/airlock, such
	// as the browser image's /opt/airlock/browser.sh, stays visible). On Docker
	// execd is copied into the container at /opt/airlock/execd instead, which
	// hides nothing.
	ExecdDir = "/opt/airlock-execd"
	// ExecdPath is where execd lives in the sandbox container.
	ExecdPath   = ExecdDir + "/execd"
	execdVolume = "airlock-execd"
	// NodeExecdDir is where the node's execd (Config.ExecdClaim) is mounted read-only
	// in the sandbox container (and the trust init container); NodeExecdPath is execd
	// there.
	NodeExecdDir    = "/opt/airlock-execd-node"
	NodeExecdPath   = NodeExecdDir + "/execd"
	nodeExecdVolume = "airlock-execd-node"
)

// Providers of the sandbox workload.
const (
	ProviderPod          = "pod"
	ProviderAgentSandbox = "agent-sandbox"
)

// Config configures the runtime. Zero values take the defaults named on each field.
type Config struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// Dynamic is required for the agent-sandbox provider.
	Dynamic dynamic.Interface
	// Namespace is where sandbox pods run. Required.
	Namespace string
	// Instance is the lifecycle instance id (label airlock.dev/instance): List returns
	// only the sandboxes carrying it. Required.
	Instance string
	// Provider is ProviderPod (default) or ProviderAgentSandbox.
	Provider string
	// ExecdImage carries the static execd at /execd (its --install mode copies it into
	// the pod); default airlock/execd:<version>.
	ExecdImage string
	// ExecdClaim, when set, names a PersistentVolumeClaim in Namespace holding the
	// static execd at its root (/execd): the node's copy, which the egressd DaemonSet
	// installs on every node (deploy/kubernetes: a read-only hostPath PersistentVolume
	// bound to this claim). Sandbox pods then mount it read-only at NodeExecdDir and
	// need no init container, which saves a kubelet sync on every start (up to a
	// second on kubelets before 1.36, which wait for their next PLEG relist); the
	// execd token reaches execd only as its SHA-256 on the command line
	// (execd --access-token-sha256), so no Secret is made either. A sandbox that must
	// trust extra CAs still gets the trust init container. Empty: execd from
	// ExecdImage's init container.
	ExecdClaim string
	// RuntimeClassName selects gVisor, Kata, … (empty: the cluster's default).
	RuntimeClassName string
	// DNS are the pods' resolvers: the node-local address of egressd's DNS filter
	// (dnsPolicy None), e.g. 169.254.20.10. Empty leaves the cluster's DNS
	// (ClusterFirst) and the NetworkPolicy then admits DNS to kube-dns only.
	DNS []netip.Addr
	// L7Port, with DNS, is the port of egressd's transparent L7 proxy on the DNS
	// addresses, where the node redirects a sandbox's checked TCP: the NetworkPolicy
	// admits TCP to it there. 0: egressd runs no proxy.
	L7Port uint16
	// Deny are the ranges no sandbox may reach whatever its policy allows: the cluster's
	// pods, Services and nodes (egressd's --deny, the same values). The NetworkPolicy
	// excepts them from each egress ipBlock (a policy CIDR inside one is left out), and
	// an allow-all policy admits every address but them, so that with the node's egressd
	// stopped a sandbox still reaches no pod, Service or node. Empty: policy CIDRs and
	// allow-all are admitted as written.
	Deny []netip.Prefix
	// AllowedHostRoots are the node directories under which host-path volumes may be
	// mounted; empty disables host-path volumes.
	AllowedHostRoots []string
	// MaxPTYSessions is execd's --max-pty-sessions in every sandbox: the interactive
	// terminals (PTY sessions) a sandbox may hold open at once; 0: execd's default
	// (execd.DefaultMaxPTYSessions, 16); negative: no limit.
	MaxPTYSessions int
	// SystemNamespace holds the gateway and lifecycle pods, the only sources of ingress
	// to sandboxes (NetworkPolicy); default "airlock-system".
	SystemNamespace string
	// GatewaySelector and LifecycleSelector are those pods' labels (matchLabels);
	// defaults app.kubernetes.io/name=airlock-gateway and =airlock-lifecycle.
	GatewaySelector, LifecycleSelector map[string]string
	// ExecdPort is execd's port, declared as the sandbox container's port "execd";
	// default 44772 (opensandbox.ExecdPort).
	ExecdPort int
	// Snapshots enables snapshots (lifecycle.Snapshotter: the nodes' egressd commits a
	// sandbox's container into a node-local image; snapshot.go); nil: the snapshot
	// routes answer 501.
	Snapshots *SnapshotConfig
	// Log receives the runtime's records (never a credential); default: discarded.
	Log *slog.Logger
}

// Runtime is the Kubernetes runtime; safe for concurrent use.
type Runtime struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and fills its defaults; it performs no I/O.
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
	if len(cfg.GatewaySelector) == 0 {
		cfg.GatewaySelector = map[string]string{"app.kubernetes.io/name": "airlock-gateway"}
	}
	if len(cfg.LifecycleSelector) == 0 {
		cfg.LifecycleSelector = map[string]string{"app.kubernetes.io/name": "airlock-lifecycle"}
	}
	if cfg.ExecdPort == 0 {
		cfg.ExecdPort = opensandbox.ExecdPort
	}
	if cfg.ExecdPort < 1 || cfg.ExecdPort > 65535 {
		return nil, fmt.Errorf("kube: execd port %d out of range", cfg.ExecdPort)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, r := range cfg.AllowedHostRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("kube: allowed host root %q is not absolute", r)
		}
	}
	for _, a := range cfg.DNS {
		if !a.IsValid() {
			return nil, errors.New("kube: invalid DNS address")
		}
	}
	return &Runtime{cfg: cfg, log: cfg.Log}, nil
}

// Kind is "kubernetes".
func (r *Runtime) Kind() string { return "kubernetes" }

// PodName is the pod (and NetworkPolicy, agent-sandbox Sandbox) name of sandbox id.
func PodName(id string) string { return "sbx-" + id }

// PullSecretName is the image pull Secret of sandbox id (only with image auth).
func PullSecretName(id string) string { return PodName(id) + "-pull" }

// Create makes the sandbox's objects: the NetworkPolicy first (so the pod never runs
// without it), then the pod (or agent-sandbox Sandbox), then the image pull Secret
// when the request carries image auth; the NetworkPolicy and the Secret are owned by
// the pod (or Sandbox), so the garbage collector removes them with it. Create returns
// once they exist, Phase created and no address: the pod has one once it is scheduled
// and runs (lifecycle asks Inspect). On error every object made is deleted. Errors
// wrap lifecycle.ErrInvalidVolume, ErrInvalidResources or ErrInvalidRequest for bad
// input.
func (r *Runtime) Create(ctx context.Context, spec lifecycle.Spec) (inst lifecycle.Instance, err error) {
	pod, err := r.podFor(spec)
	if err != nil {
		return inst, err
	}
	name := PodName(spec.SandboxID)
	defer func() {
		if err != nil {
			if rmErr := r.removeObjects(context.WithoutCancel(ctx), spec.SandboxID); rmErr != nil {
				r.log.Error("removing a half-created sandbox failed", "sandbox_id", spec.SandboxID, "err", rmErr)
			}
		}
	}()
	nps := r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace)
	if _, err = nps.Create(ctx, r.networkPolicy(spec.SandboxID, spec.Egress), metav1.CreateOptions{}); err != nil {
		return inst, fmt.Errorf("kube: creating the NetworkPolicy of %s: %w", spec.SandboxID, err)
	}
	// The execd token's Secret exists before the pod (its init container reads it) and
	// belongs to the pod once that exists.
	tokenSecret := spec.ExecdToken != "" && r.cfg.ExecdClaim == ""
	if tokenSecret {
		if _, err = r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Create(ctx, execdTokenSecret(r.cfg.Namespace, spec, r.labels(spec.SandboxID)), metav1.CreateOptions{}); err != nil {
			return inst, fmt.Errorf("kube: creating the execd token Secret of %s: %w", spec.SandboxID, err)
		}
	}
	if spec.ImageAuth != nil {
		pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: PullSecretName(spec.SandboxID)}}
	}
	var owner metav1.OwnerReference
	switch r.cfg.Provider {
	case ProviderAgentSandbox:
		owner, err = r.createAgentSandbox(ctx, pod)
	default:
		var created *corev1.Pod
		if created, err = r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err == nil {
			owner = metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: created.Name, UID: created.UID}
		}
	}
	if err != nil {
		if apierrors.IsInvalid(err) {
			return inst, fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
		}
		return inst, fmt.Errorf("kube: creating the pod of %s: %w", spec.SandboxID, err)
	}
	if err = r.own(ctx, name, owner); err != nil {
		return inst, fmt.Errorf("kube: owning the NetworkPolicy of %s: %w", spec.SandboxID, err)
	}
	if tokenSecret {
		if err = r.ownSecret(ctx, ExecdTokenSecretName(spec.SandboxID), owner); err != nil {
			return inst, fmt.Errorf("kube: owning the execd token Secret of %s: %w", spec.SandboxID, err)
		}
	}
	if spec.ImageAuth != nil {
		sec, err := pullSecret(r.cfg.Namespace, spec, r.labels(spec.SandboxID))
		if err != nil {
			return inst, err
		}
		sec.OwnerReferences = []metav1.OwnerReference{owner}
		if _, err = r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return inst, fmt.Errorf("kube: creating the image pull Secret of %s: %w", spec.SandboxID, err)
		}
	}
	r.log.Debug("sandbox created", "sandbox_id", spec.SandboxID, "namespace", r.cfg.Namespace, "provider", r.cfg.Provider)
	return lifecycle.Instance{SandboxID: spec.SandboxID, ContainerID: name, Phase: lifecycle.PhaseCreated}, nil
}

// ownSecret makes owner the owner of the Secret name (a merge patch).
func (r *Runtime) ownSecret(ctx context.Context, name string, owner metav1.OwnerReference) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{owner}}})
	if err != nil {
		return err
	}
	_, err = r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// own makes owner the owner of the NetworkPolicy name (a merge patch).
func (r *Runtime) own(ctx context.Context, name string, owner metav1.OwnerReference) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{owner}}})
	if err != nil {
		return err
	}
	_, err = r.cfg.Client.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (r *Runtime) labels(id string) map[string]string {
	return map[string]string{LabelSandboxID: id, LabelInstance: r.cfg.Instance, LabelManagedBy: "airlock"}
}

// Remove deletes the sandbox's pod (or agent-sandbox Sandbox), NetworkPolicy and pull
// Secret at once (grace period 0, background propagation), and its pause image and
// record (pause.go); missing objects are not an error. PersistentVolumeClaims are the user's and stay.
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
	keep("image pull Secret", r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Delete(ctx, PullSecretName(id), opts))
	keep("execd token Secret", r.cfg.Client.CoreV1().Secrets(r.cfg.Namespace).Delete(ctx, ExecdTokenSecretName(id), opts))
	keep("pause image and record", r.removePaused(ctx, id))
	return errors.Join(errs...)
}

// Inspect returns the sandbox's view by its ContainerID (the pod name): Pending →
// created, Running → running (with its addresses and node), Succeeded/Failed or being
// deleted → exited; a paused sandbox (no pod, its pause record) → paused.
// lifecycle.ErrInstanceGone when it does not exist (agent-sandbox:
// when the Sandbox does not; a Sandbox whose pod is not made yet is created).
func (r *Runtime) Inspect(ctx context.Context, name string) (lifecycle.Instance, error) {
	if r.cfg.Provider == ProviderAgentSandbox {
		return r.inspectAgentSandbox(ctx, name)
	}
	pod, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return r.inspectPaused(ctx, name)
	}
	if err != nil {
		return lifecycle.Instance{}, fmt.Errorf("kube: reading pod %s: %w", name, err)
	}
	return instanceOf(pod), nil
}

// instanceOf maps a pod's status; addresses only while it runs.
func instanceOf(pod *corev1.Pod) lifecycle.Instance {
	in := lifecycle.Instance{SandboxID: pod.Labels[LabelSandboxID], ContainerID: pod.Name, Node: pod.Spec.NodeName, PodUID: string(pod.UID),
		HostIP: pod.Status.HostIP}
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
	if in.Phase != lifecycle.PhaseRunning {
		return in
	}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if a.Is4() && !in.Address.IsValid() {
			in.Address = a
		} else if a.Is6() && !in.Address6.IsValid() {
			in.Address6 = a
		}
	}
	return in
}

// List returns every sandbox of this lifecycle instance (label airlock.dev/instance),
// in any state (paused ones from their pause records); agent-sandbox Sandboxes whose pod is not made yet are created.
func (r *Runtime) List(ctx context.Context) ([]lifecycle.Instance, error) {
	sel := metav1.ListOptions{LabelSelector: LabelInstance + "=" + r.cfg.Instance}
	pods, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("kube: listing pods: %w", err)
	}
	byName := make(map[string]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	if r.cfg.Provider == ProviderAgentSandbox {
		return r.listAgentSandboxes(ctx, sel, byName)
	}
	// A paused sandbox has no pod: List leaves it out, and lifecycle asks Inspect (its
	// pause record, by name: lifecycle may not list the Secrets of this namespace).
	out := make([]lifecycle.Instance, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, instanceOf(byName[name]))
	}
	return out, nil
}

var (
	_ lifecycle.Runtime        = (*Runtime)(nil)
	_ lifecycle.EgressUpdater  = (*Runtime)(nil)
	_ lifecycle.EgressRepairer = (*Runtime)(nil)
)
