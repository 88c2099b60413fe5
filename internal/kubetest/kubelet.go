package kubetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
)

// The pod contract of Airlock's Kubernetes runtime (lifecycle/kube), repeated here so
// that lifecycle/kube's own tests can import this package without a cycle.
const (
	podLabelSandboxID       = "airlock.dev/sandbox-id"
	podAnnotationEntrypoint = "airlock.dev/entrypoint"
	podContainerName        = "sandbox"
	holdFlag                = "--hold"
)

// kubeletWorkers bounds how many pods a Kubelet starts or stops at once.
const kubeletWorkers = 2

// kubeletOpTimeout bounds one container start (an image template build included) or
// removal.
const kubeletOpTimeout = 3 * time.Minute

// KubeletConfig configures a test kubelet.
type KubeletConfig struct {
	// Namespace whose pods the kubelet runs. Required.
	Namespace string
	// Node is the node name pods are bound to (spec.nodeName); default "kubetest-node".
	Node string
	// ExecdPath is the static execd binary on this host (lctest.Execd builds one),
	// copied into every container as the Docker runtime does. Required.
	ExecdPath string
	// Network is the Docker bridge network of the containers (at most 15 characters);
	// default "altest-kl0". Each test binary should use its own: the network is removed
	// when the last Kubelet of this process using it closes.
	Network string
	// Images maps a pod's image to the local image that runs it; an image not in the
	// map runs as it is. Images are never pulled: one missing on this host fails the
	// pod (reason ErrImagePull).
	Images map[string]string
	// DNS and DNSOnGateway are passed to docker.Config (the containers' resolvers).
	DNS          []netip.Addr
	DNSOnGateway bool
	// Log receives the kubelet's and Docker runtime's records; default warnings and
	// errors on stderr.
	Log *slog.Logger
}

// Kubelet plays a node's kubelet for the Airlock sandbox pods of one namespace: it
// follows the pods through an informer and backs each new one with a real Docker
// sandbox container (package lifecycle/docker: execd as PID 1 wrapping the pod's
// entrypoint), then binds the pod to the node and reports it Running and Ready with
// the container's bridge address as pod IP, which the host reaches directly (execd at
// podIP:44772). A pod that cannot be started (bad shape, image not on this host,
// engine error) is reported Failed with a reason and message. A pod being deleted
// loses its container and is then deleted for good (the kubelet's grace-period-0
// confirmation); a pod gone from the API loses its container. At most two pods start
// or stop at once.
//
// What a pod maps to: sandbox id from label airlock.dev/sandbox-id; image, env (plain
// values) and CPU/memory limits from container "sandbox"; entrypoint from annotation
// airlock.dev/entrypoint (else the command after "--"); hold when the command carries
// --hold before "--". Init containers, volumes, DNS config and security contexts are
// not applied. A pod already Running or finished when first seen is left alone, and a
// container whose process exits does not change its pod's status.
//
// Methods are safe for concurrent use.
type Kubelet struct {
	env *Env
	cfg KubeletConfig
	log *slog.Logger
	cli *client.Client
	rt  *docker.Runtime

	factory informers.SharedInformerFactory
	lister  listersv1.PodLister
	queue   workqueue.TypedRateLimitingInterface[string]
	stop    chan struct{}
	workers sync.WaitGroup

	mu   sync.Mutex
	pods map[string]podContainer // by pod name

	closeOnce sync.Once
	closeErr  error
}

// podContainer is the container backing one pod (by UID: a pod deleted and created
// again under the same name gets a new one).
type podContainer struct {
	uid  types.UID
	inst lifecycle.Instance
}

// RunKubelet starts a Kubelet for cfg.Namespace on e and closes it when t ends (every
// container it started is removed). It fails t on bad config or when the Docker
// network cannot be set up; callers check Docker and the images first
// (testenv.NeedSandboxImage).
func (e *Env) RunKubelet(t testing.TB, cfg KubeletConfig) *Kubelet {
	t.Helper()
	k, err := NewKubelet(e, cfg)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("kubetest: closing the kubelet: %v", err)
		}
	})
	return k
}

// NewKubelet starts a Kubelet for cfg.Namespace on e: the Docker network exists and
// the pod informer has synced when it returns. Call Close.
func NewKubelet(e *Env, cfg KubeletConfig) (*Kubelet, error) {
	if cfg.Namespace == "" || cfg.ExecdPath == "" {
		return nil, errors.New("kubelet: Namespace and ExecdPath are required")
	}
	if cfg.Node == "" {
		cfg.Node = "kubetest-node"
	}
	if cfg.Network == "" {
		cfg.Network = "altest-kl0"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	log := cfg.Log.With("component", "kubelet", "namespace", cfg.Namespace)
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("kubelet: %w", err)
	}
	rt, err := docker.New(docker.Config{
		Client:       cli,
		Instance:     fmt.Sprintf("kubelet-%s-%d", cfg.Namespace, time.Now().UnixNano()),
		Network:      cfg.Network,
		ExecdPath:    cfg.ExecdPath,
		NamePrefix:   "altest-kl-" + cfg.Namespace + "-",
		DNS:          cfg.DNS,
		DNSOnGateway: cfg.DNSOnGateway,
		Log:          log,
	})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("kubelet: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := acquireNetwork(ctx, rt, cfg.Network); err != nil {
		cli.Close()
		return nil, fmt.Errorf("kubelet: %w", err)
	}
	k := &Kubelet{
		env:   e,
		cfg:   cfg,
		log:   log,
		cli:   cli,
		rt:    rt,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		stop:  make(chan struct{}),
		pods:  map[string]podContainer{},
	}
	k.factory = informers.NewSharedInformerFactoryWithOptions(e.Client, 0, informers.WithNamespace(cfg.Namespace))
	pods := k.factory.Core().V1().Pods()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			_, name, _ := cache.SplitMetaNamespaceKey(key)
			k.queue.Add(name)
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		k.Close()
		return nil, fmt.Errorf("kubelet: %w", err)
	}
	k.lister = pods.Lister()
	k.factory.Start(k.stop)
	for typ, ok := range k.factory.WaitForCacheSync(k.stop) {
		if !ok {
			k.Close()
			return nil, fmt.Errorf("kubelet: the %v informer did not sync", typ)
		}
	}
	for range kubeletWorkers {
		k.workers.Go(func() {
			for k.next() {
			}
		})
	}
	return k, nil
}

// Container returns the container backing pod name (Pid, Address, ContainerID), false
// when the kubelet runs no container for it.
func (k *Kubelet) Container(pod string) (lifecycle.Instance, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	pc, ok := k.pods[pod]
	return pc.inst, ok
}

// Network returns the containers' Docker network: its name, IPv4 subnet and gateway
// (the host's address on the bridge).
func (k *Kubelet) Network() (name string, subnet netip.Prefix, gateway netip.Addr) {
	return k.rt.Network()
}

// Close stops following pods, removes every container the kubelet started (pod
// statuses stay as they are) and the Docker network when no other Kubelet of this
// process uses it. Safe to call twice.
func (k *Kubelet) Close() error {
	k.closeOnce.Do(func() {
		// Workers finish what they do (an aborted removal would leave the engine
		// removing a container while Close removes the network).
		close(k.stop)
		k.queue.ShutDown()
		k.workers.Wait()
		if k.factory != nil {
			k.factory.Shutdown()
		}
		ctx, cancel := context.WithTimeout(context.Background(), kubeletOpTimeout)
		defer cancel()
		var errs []error
		insts, err := k.rt.List(ctx)
		errs = append(errs, err)
		for _, in := range insts {
			errs = append(errs, k.rt.Remove(ctx, in))
		}
		k.mu.Lock()
		clear(k.pods)
		k.mu.Unlock()
		k.releaseNetwork(ctx)
		errs = append(errs, k.cli.Close())
		k.closeErr = errors.Join(errs...)
	})
	return k.closeErr
}

// next handles one queued pod; false once the queue is shut down.
func (k *Kubelet) next() bool {
	name, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(name)
	ctx, cancel := context.WithTimeout(context.Background(), kubeletOpTimeout)
	defer cancel()
	if err := k.sync(ctx, name); err != nil {
		if k.queue.NumRequeues(name) < 5 {
			k.queue.AddRateLimited(name)
			return true
		}
		k.log.Error("pod sync failed", "pod", name, "err", err)
	}
	k.queue.Forget(name)
	return true
}

// sync brings pod name's container in line with the pod: none when the pod is gone or
// being deleted, one started (and the pod reported Running) for a new pod.
func (k *Kubelet) sync(ctx context.Context, name string) error {
	pod, err := k.lister.Pods(k.cfg.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return k.removeContainer(ctx, name, "")
	}
	if err != nil {
		return err
	}
	if err := k.removeContainer(ctx, name, pod.UID); err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil {
		if err := k.removeContainer(ctx, name, ""); err != nil {
			return err
		}
		// The kubelet's confirmation that the pod's containers are gone.
		zero := int64(0)
		err := k.env.Client.CoreV1().Pods(k.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("confirming the deletion of pod %s: %w", name, err)
		}
		return nil
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return nil // running (ours, or reported by the test itself) or finished
	}
	inst, ok := k.Container(name)
	if !ok {
		spec, err := podSpec(pod, k.cfg.Images)
		if err != nil {
			return k.setFailed(ctx, pod, "InvalidPod", err)
		}
		if spec.ExecdToken, err = k.execdToken(ctx, pod); err != nil {
			return err // as a kubelet: retried until the Secret exists
		}
		// Never a pull: test traffic stays on this machine.
		if _, err := k.cli.ImageInspect(ctx, spec.Image); err != nil {
			return k.setFailed(ctx, pod, "ErrImagePull",
				fmt.Errorf("image %s is not on this host (the test kubelet never pulls; map it with KubeletConfig.Images): %w", spec.Image, err))
		}
		inst, err = k.rt.Create(ctx, spec)
		if err != nil && k.networkGone(ctx) {
			// Another test process removed the network (it is shared by name): once more.
			if err = acquireNetwork(ctx, k.rt, ""); err == nil {
				inst, err = k.rt.Create(ctx, spec)
			}
		}
		if err != nil {
			reason := "CreateContainerError"
			if errors.Is(err, lifecycle.ErrImageUnavailable) {
				reason = "ErrImagePull"
			}
			return k.setFailed(ctx, pod, reason, err)
		}
		k.mu.Lock()
		k.pods[name] = podContainer{uid: pod.UID, inst: inst}
		k.mu.Unlock()
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		return k.env.SetPodRunning(ctx, k.cfg.Namespace, name, k.cfg.Node, inst.Address.String())
	})
	if apierrors.IsNotFound(err) {
		return k.removeContainer(ctx, name, "")
	}
	if err != nil {
		return fmt.Errorf("reporting pod %s running: %w", name, err)
	}
	return nil
}

// removeContainer removes the container of pod name unless it belongs to the pod with
// UID keep.
func (k *Kubelet) removeContainer(ctx context.Context, name string, keep types.UID) error {
	k.mu.Lock()
	pc, ok := k.pods[name]
	k.mu.Unlock()
	if !ok || keep != "" && pc.uid == keep {
		return nil
	}
	if err := k.rt.Remove(ctx, pc.inst); err != nil {
		return err
	}
	k.mu.Lock()
	if cur, ok := k.pods[name]; ok && cur.uid == pc.uid {
		delete(k.pods, name)
	}
	k.mu.Unlock()
	return nil
}

// setFailed reports pod Failed with reason (a CamelCase word) and cause as message.
func (k *Kubelet) setFailed(ctx context.Context, pod *corev1.Pod, reason string, cause error) error {
	k.log.Warn("pod failed", "pod", pod.Name, "reason", reason, "err", cause)
	pods := k.env.Client.CoreV1().Pods(k.cfg.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID != pod.UID {
			return nil
		}
		p.Status.Phase = corev1.PodFailed
		p.Status.Reason = reason
		p.Status.Message = cause.Error()
		_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reporting pod %s failed: %w", pod.Name, err)
	}
	return nil
}

// execdToken is the execd token the pod's init containers take from a Secret
// (environment variable EXECD_ACCESS_TOKEN, valueFrom secretKeyRef), "" when none: the
// Docker runtime then delivers it as it does on one host.
func (k *Kubelet) execdToken(ctx context.Context, pod *corev1.Pod) (string, error) {
	for _, c := range pod.Spec.InitContainers {
		for _, e := range c.Env {
			if e.Name != "EXECD_ACCESS_TOKEN" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			sec, err := k.env.Client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return "", fmt.Errorf("pod %s: the execd token Secret %s: %w", pod.Name, ref.Name, err)
			}
			return string(sec.Data[ref.Key]), nil
		}
	}
	return "", nil
}

// podSpec maps an Airlock sandbox pod to the Docker runtime's spec, the pod's image
// replaced through images.
func podSpec(pod *corev1.Pod, images map[string]string) (lifecycle.Spec, error) {
	id := pod.Labels[podLabelSandboxID]
	if id == "" {
		return lifecycle.Spec{}, fmt.Errorf("pod %s has no %s label", pod.Name, podLabelSandboxID)
	}
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == podContainerName })
	if i < 0 {
		return lifecycle.Spec{}, fmt.Errorf("pod %s has no container %q", pod.Name, podContainerName)
	}
	c := pod.Spec.Containers[i]
	spec := lifecycle.Spec{SandboxID: id, Image: c.Image}
	if img, ok := images[c.Image]; ok {
		spec.Image = img
	}
	dash := slices.Index(c.Command, "--")
	if dash < 0 {
		dash = len(c.Command)
	}
	spec.Hold = slices.Contains(c.Command[:dash], holdFlag)
	if a, ok := pod.Annotations[podAnnotationEntrypoint]; ok {
		if err := json.Unmarshal([]byte(a), &spec.Entrypoint); err != nil {
			return lifecycle.Spec{}, fmt.Errorf("pod %s: annotation %s is not a JSON array of strings: %v", pod.Name, podAnnotationEntrypoint, err)
		}
	} else if dash < len(c.Command) {
		spec.Entrypoint = slices.Clone(c.Command[dash+1:])
	}
	if len(spec.Entrypoint) == 0 {
		return lifecycle.Spec{}, fmt.Errorf("pod %s has no entrypoint (annotation %s)", pod.Name, podAnnotationEntrypoint)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			return lifecycle.Spec{}, fmt.Errorf("pod %s: env %s uses valueFrom, which the test kubelet does not resolve", pod.Name, e.Name)
		}
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[e.Name] = e.Value
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		spec.NanoCPUs = q.MilliValue() * 1e6
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		spec.MemoryBytes = q.Value()
	}
	return spec, nil
}

// Docker networks shared by the kubelets of this process, by name: set up by the
// first, removed by the last.
var (
	networksMu sync.Mutex
	networks   = map[string]int{}
)

// acquireNetwork sets rt's network up (and learns its subnet and gateway) and counts
// one more user of network name; an empty name only sets it up again.
func acquireNetwork(ctx context.Context, rt *docker.Runtime, name string) error {
	networksMu.Lock()
	defer networksMu.Unlock()
	if err := rt.Setup(ctx); err != nil {
		return err
	}
	if name != "" {
		networks[name]++
	}
	return nil
}

// networkGone reports whether the kubelet's network no longer exists.
func (k *Kubelet) networkGone(ctx context.Context) bool {
	_, err := k.cli.NetworkInspect(ctx, k.cfg.Network, client.NetworkInspectOptions{})
	return cerrdefs.IsNotFound(err)
}

// releaseNetwork removes the network when no other kubelet of this process uses it;
// a failure (a container of someone else still attached) is only logged.
func (k *Kubelet) releaseNetwork(ctx context.Context) {
	name := k.cfg.Network
	networksMu.Lock()
	defer networksMu.Unlock()
	if networks[name]--; networks[name] > 0 {
		return
	}
	delete(networks, name)
	_, err := k.cli.NetworkRemove(ctx, name, client.NetworkRemoveOptions{})
	if err != nil && !cerrdefs.IsNotFound(err) {
		k.log.Warn("removing the network failed", "network", name, "err", err)
	}
}
