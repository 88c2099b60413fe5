package kube

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/airlockdev/airlock/lifecycle"
)

// DroppedCapabilities are removed from every container of a sandbox pod: the Docker
// runtime's list (lifecycle/docker.DroppedCapabilities) on top of the container
// runtime's default set, which containerd and CRI-O share with Docker.
var DroppedCapabilities = []corev1.Capability{
	"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "MKNOD",
	"SYS_BOOT", "SYS_TIME", "SYS_RAWIO", "AUDIT_WRITE",
}

// Where a sandbox that must trust extra CAs (Spec.TrustedCAPEM) finds them: the trust
// init container writes the image's system bundle plus the CAs, and the CAs alone,
// into execd's emptyDir (the image's own files cannot change on Kubernetes).
const (
	// TrustBundlePath is the image's system bundle (/etc/ssl/certs/ca-certificates.crt)
	// followed by the CAs: SSL_CERT_FILE, REQUESTS_CA_BUNDLE and GIT_SSL_CAINFO (git's
	// libcurl does not read SSL_CERT_FILE).
	TrustBundlePath = ExecdDir + "/ca-certificates.crt"
	// TrustExtraPath holds the CAs alone: NODE_EXTRA_CA_CERTS.
	TrustExtraPath = ExecdDir + "/airlock-credential-proxy.crt"
	// TrustedCAEnv carries the PEM into the trust init container (never the sandbox's).
	TrustedCAEnv = "AIRLOCK_TRUSTED_CA"
)

// Where a sandbox's execd token (Spec.ExecdToken) travels: a Secret per sandbox
// (ExecdTokenSecretName), read only by the execd init container (an environment
// variable from the Secret, never the sandbox container's), which writes it into a
// memory emptyDir of its own; execd reads and removes it there at start
// (--access-token-file) before anything of the user runs.
const (
	// ExecdTokenPath is the token file in the sandbox container.
	ExecdTokenPath = "/run/airlock-execd/execd-token"
	// ExecdTokenKey is the key of the token in its Secret.
	ExecdTokenKey = "token"
	tokenVolume   = "airlock-execd-token"
)

// ExecdTokenSecretName is the Secret holding sandbox id's execd token.
func ExecdTokenSecretName(id string) string { return PodName(id) + "-execd" }

// execdTokenSecret is the Secret of spec's execd token.
func execdTokenSecret(ns string, spec lifecycle.Spec, labels map[string]string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ExecdTokenSecretName(spec.SandboxID), Namespace: ns, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ExecdTokenKey: []byte(spec.ExecdToken)},
	}
}

// podFor builds the sandbox's pod; bad volumes, limits and platforms are errors
// wrapping lifecycle.ErrInvalidVolume, ErrInvalidResources and ErrInvalidRequest.
func (r *Runtime) podFor(spec lifecycle.Spec) (*corev1.Pod, error) {
	if msgs := validation.IsDNS1123Label(PodName(spec.SandboxID)); len(msgs) > 0 {
		return nil, fmt.Errorf("%w: sandbox id %q: %s", lifecycle.ErrInvalidRequest, spec.SandboxID, strings.Join(msgs, "; "))
	}
	if len(spec.Entrypoint) == 0 {
		return nil, fmt.Errorf("%w: the entrypoint is empty", lifecycle.ErrInvalidRequest)
	}
	entry, err := json.Marshal(spec.Entrypoint)
	if err != nil {
		return nil, err
	}
	envs := maps.Clone(spec.Env)
	if len(spec.TrustedCAPEM) > 0 {
		if envs == nil {
			envs = map[string]string{}
		}
		envs["SSL_CERT_FILE"] = TrustBundlePath
		envs["REQUESTS_CA_BUNDLE"] = TrustBundlePath
		envs["GIT_SSL_CAINFO"] = TrustBundlePath
		envs["NODE_EXTRA_CA_CERTS"] = TrustExtraPath
	}
	env := make([]corev1.EnvVar, 0, len(envs))
	for _, k := range slices.Sorted(maps.Keys(envs)) {
		env = append(env, corev1.EnvVar{Name: k, Value: envs[k]})
	}
	res, err := resources(spec)
	if err != nil {
		return nil, err
	}
	vols, mounts, err := r.volumes(spec.Volumes)
	if err != nil {
		return nil, err
	}
	if r.cfg.ExecdClaim != "" {
		return r.nodeExecdPod(spec, string(entry), env, res, vols, mounts)
	}
	var tokenFlags []string
	if spec.ExecdToken != "" {
		tokenFlags = []string{"--access-token-file", ExecdTokenPath}
	}
	cmd := r.execdCommand(spec, ExecdPath, tokenFlags)
	execdDir := ExecdDir
	inits := []corev1.Container{{
		Name:            InitContainerName,
		Image:           r.cfg.ExecdImage,
		Command:         []string{"/execd", "--install", ExecdPath},
		VolumeMounts:    []corev1.VolumeMount{{Name: execdVolume, MountPath: execdDir}},
		Resources:       res,
		SecurityContext: hardened(),
	}}
	mainMounts := []corev1.VolumeMount{{Name: execdVolume, MountPath: execdDir, ReadOnly: true}}
	podVolumes := []corev1.Volume{{Name: execdVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if spec.ExecdToken != "" {
		tokenDir := filepath.Dir(ExecdTokenPath)
		tm := corev1.VolumeMount{Name: tokenVolume, MountPath: tokenDir}
		inits[0].Command = append(inits[0].Command, "--install-token", ExecdTokenPath)
		inits[0].VolumeMounts = append(inits[0].VolumeMounts, tm)
		inits[0].Env = []corev1.EnvVar{{Name: "EXECD_ACCESS_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: ExecdTokenSecretName(spec.SandboxID)}, Key: ExecdTokenKey,
		}}}}
		mainMounts = append(mainMounts, tm)
		podVolumes = append(podVolumes, corev1.Volume{Name: tokenVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory},
		}})
	}
	if len(spec.TrustedCAPEM) > 0 {
		// execd, already in the emptyDir, reads the user's image's bundle from inside it.
		inits = append(inits, trustInit(spec, ExecdPath, []corev1.VolumeMount{{Name: execdVolume, MountPath: execdDir}}, res))
	}
	return r.finishPod(spec, string(entry), inits, r.sandboxContainer(spec, cmd, env, res, append(mainMounts, mounts...)),
		append(podVolumes, vols...))
}

// execdCommand is the sandbox container's command: execd at path running spec's
// entrypoint, held until released when spec.Hold, with its token by tokenFlags and
// the PTY cap (Config.MaxPTYSessions), in both layouts (init container, node's execd).
func (r *Runtime) execdCommand(spec lifecycle.Spec, path string, tokenFlags []string) []string {
	cmd := []string{path, "--exec"}
	if spec.Hold {
		cmd = append(cmd, "--hold")
	}
	cmd = append(cmd, tokenFlags...)
	if r.cfg.MaxPTYSessions != 0 {
		cmd = append(cmd, "--max-pty-sessions", strconv.Itoa(r.cfg.MaxPTYSessions))
	}
	return append(append(cmd, "--"), spec.Entrypoint...)
}

// sandboxContainer is the container running the user's image under execd (cmd).
func (r *Runtime) sandboxContainer(spec lifecycle.Spec, cmd []string, env []corev1.EnvVar, res corev1.ResourceRequirements,
	mounts []corev1.VolumeMount) corev1.Container {
	return corev1.Container{
		Name:    ContainerName,
		Image:   spec.Image,
		Command: cmd,
		Env:     env,
		Ports: []corev1.ContainerPort{{
			Name: "execd", ContainerPort: int32(r.cfg.ExecdPort), Protocol: corev1.ProtocolTCP,
		}},
		Resources:       res,
		VolumeMounts:    mounts,
		SecurityContext: hardened(),
	}
}

// trustInit is the trust init container: execd at execdPath (in mounts) writes the
// image's system bundle plus spec's CAs into ExecdDir (an emptyDir in mounts).
func trustInit(spec lifecycle.Spec, execdPath string, mounts []corev1.VolumeMount, res corev1.ResourceRequirements) corev1.Container {
	return corev1.Container{
		Name:            TrustContainerName,
		Image:           spec.Image,
		Command:         []string{execdPath, "--install-trust", ExecdDir},
		Env:             []corev1.EnvVar{{Name: TrustedCAEnv, Value: string(spec.TrustedCAPEM)}},
		VolumeMounts:    mounts,
		Resources:       res,
		SecurityContext: hardened(),
	}
}

// nodeExecdPod builds the sandbox's pod with the node's execd (Config.ExecdClaim):
// the claim mounted read-only at NodeExecdDir, no execd init container, the token as
// its SHA-256 only (execd --access-token-sha256); the trust init container, with
// spec.TrustedCAPEM, writes into an emptyDir at ExecdDir as in the other layout.
func (r *Runtime) nodeExecdPod(spec lifecycle.Spec, entry string, env []corev1.EnvVar, res corev1.ResourceRequirements,
	vols []corev1.Volume, mounts []corev1.VolumeMount) (*corev1.Pod, error) {
	var tokenFlags []string
	if spec.ExecdToken != "" {
		sum := sha256.Sum256([]byte(spec.ExecdToken))
		tokenFlags = []string{"--access-token-sha256", hex.EncodeToString(sum[:])}
	}
	cmd := r.execdCommand(spec, NodeExecdPath, tokenFlags)
	node := corev1.VolumeMount{Name: nodeExecdVolume, MountPath: NodeExecdDir, ReadOnly: true}
	mainMounts := []corev1.VolumeMount{node}
	podVolumes := []corev1.Volume{{Name: nodeExecdVolume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: r.cfg.ExecdClaim, ReadOnly: true},
	}}}
	var inits []corev1.Container
	if len(spec.TrustedCAPEM) > 0 {
		podVolumes = append(podVolumes, corev1.Volume{Name: execdVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		mainMounts = append(mainMounts, corev1.VolumeMount{Name: execdVolume, MountPath: ExecdDir, ReadOnly: true})
		inits = append(inits, trustInit(spec, NodeExecdPath, []corev1.VolumeMount{node, {Name: execdVolume, MountPath: ExecdDir}}, res))
	}
	return r.finishPod(spec, entry, inits, r.sandboxContainer(spec, cmd, env, res, append(mainMounts, mounts...)),
		append(podVolumes, vols...))
}

// finishPod wraps the containers and volumes into the sandbox's pod: hardened,
// no service account token, hostname, platform, runtime class and DNS.
func (r *Runtime) finishPod(spec lifecycle.Spec, entry string, inits []corev1.Container, main corev1.Container, volumes []corev1.Volume) (*corev1.Pod, error) {
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(spec.SandboxID),
			Namespace:   r.cfg.Namespace,
			Labels:      r.labels(spec.SandboxID),
			Annotations: map[string]string{AnnotationEntrypoint: entry},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: inits,
			Containers:     []corev1.Container{main},
			Volumes:        volumes,
		},
	}
	if len(validation.IsDNS1123Label(spec.SandboxID)) == 0 {
		pod.Spec.Hostname = spec.SandboxID // as on Docker
	}
	if p := spec.Platform; p != nil {
		if p.OS != "" && p.OS != "linux" {
			return nil, fmt.Errorf("%w: platform %s/%s: sandboxes are linux pods", lifecycle.ErrInvalidRequest, p.OS, p.Arch)
		}
		sel := map[string]string{}
		if p.OS != "" {
			sel[corev1.LabelOSStable] = p.OS
		}
		if p.Arch != "" {
			sel[corev1.LabelArchStable] = p.Arch
		}
		if len(sel) > 0 {
			pod.Spec.NodeSelector = sel
		}
	}
	restoreOnNode(pod, spec.Image)
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

// hardened is every container's security context: not privileged, no privilege
// escalation (Docker's no-new-privileges), the Docker runtime's capabilities dropped,
// seccomp RuntimeDefault.
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
// sandbox gets what it asked for, Guaranteed QoS when both are set). Kubernetes has no
// per-pod pids limit: the node's kubelet sets one for every pod (podPidsLimit), so
// Spec.Pids is not applied.
func resources(spec lifecycle.Spec) (corev1.ResourceRequirements, error) {
	if spec.NanoCPUs < 0 || spec.MemoryBytes < 0 {
		return corev1.ResourceRequirements{}, fmt.Errorf("%w: negative limit", lifecycle.ErrInvalidResources)
	}
	rl := corev1.ResourceList{}
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

// volumes maps the create request's volumes: a PersistentVolumeClaim by claim name (it
// must exist: this runtime creates none), a host path (type Directory: it must exist
// on the node) only under an allowed root; subPath and readOnly on the mount.
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
		if sp := v.SubPath; sp != "" && (filepath.IsAbs(sp) || filepath.Clean(sp) != sp || sp == ".." || strings.HasPrefix(sp, "../")) {
			return nil, nil, fmt.Errorf("%w: volume %q: subPath %q must be a relative path without ..", lifecycle.ErrInvalidVolume, v.Name, sp)
		}
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: src})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: v.MountPath, ReadOnly: v.ReadOnly, SubPath: v.SubPath})
	}
	return vols, mounts, nil
}

// hostPath checks that p, cleaned, lies under an allowed root. The node's symlinks
// cannot be resolved from here: operators keep the roots free of links that leave them.
func (r *Runtime) hostPath(name, p string) (string, error) {
	if len(r.cfg.AllowedHostRoots) == 0 {
		return "", fmt.Errorf("%w: volume %q: host-path volumes are disabled on this server", lifecycle.ErrInvalidVolume, name)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w: volume %q: host path %q is not absolute", lifecycle.ErrInvalidVolume, name, p)
	}
	c := filepath.Clean(p)
	for _, root := range r.cfg.AllowedHostRoots {
		if within(filepath.Clean(root), c) {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: volume %q: host path %s is not under an allowed root (%s)", lifecycle.ErrInvalidVolume,
		name, p, strings.Join(r.cfg.AllowedHostRoots, ", "))
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// pullSecret is a kubernetes.io/dockerconfigjson Secret for the image's registry (the
// reference's first component when it names a host, else Docker Hub).
func pullSecret(ns string, spec lifecycle.Spec, labels map[string]string) (*corev1.Secret, error) {
	a := spec.ImageAuth
	cfg := map[string]any{"auths": map[string]any{registryOf(spec.Image): map[string]string{
		"username": a.Username, "password": a.Password,
		"auth": base64.StdEncoding.EncodeToString([]byte(a.Username + ":" + a.Password)),
	}}}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: encoding the image pull Secret: %w", err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PullSecretName(spec.SandboxID), Namespace: ns, Labels: labels},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: b},
	}, nil
}

// registryOf is the registry host of an image reference, the way Docker reads one:
// the first path component when it has a dot or a port or is localhost.
func registryOf(image string) string {
	if first, _, ok := strings.Cut(image, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first
	}
	return "https://index.docker.io/v1/"
}
