// Package kubedeploy deploys Airlock on a cluster from its own manifests, as the operator
// README does it: the kustomization (deploy/kubernetes/base or an overlay) rendered with
// kustomize's Go API (what `kubectl apply -k` runs), the API key Secret created beside
// it, every object applied with server-side apply (namespaces and CRDs first), then the
// rollouts waited for. `make kube-up` (deploy/kubernetes/testenv/deploy) and the tests on
// the one-node cluster (internal/kubenode) use it.
package kubedeploy

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// SystemNamespace is the components' namespace in the base manifests (and the testnode
// overlay).
const SystemNamespace = "airlock-system"

// FieldManager is the server-side apply field manager of every object Apply writes.
const FieldManager = "airlock-kubedeploy"

// APIKeySecret is the Secret every component reads the API key from (key "api-key") and
// the execd key ("execd-key"); it is never part of the manifests (README, step 3).
const APIKeySecret = "airlock-api-key"

// ErrRollout wraps every rollout that did not complete in time; the message names the
// workload and the state of its pods.
var ErrRollout = errors.New("rollout not complete")

// Manifest is one rendered kustomization: its objects in kustomize's output order.
type Manifest struct {
	Objects []*unstructured.Unstructured
}

// Render builds the kustomization in dir (a folder with kustomization.yaml) with
// kustomize's Go API, reading the files from disk.
func Render(dir string) (*Manifest, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	m := &Manifest{}
	for _, r := range rm.Resources() {
		obj, err := r.Map()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		m.Objects = append(m.Objects, &unstructured.Unstructured{Object: obj})
	}
	return m, nil
}

// Namespaces returns the names of the manifest's Namespace objects.
func (m *Manifest) Namespaces() []string {
	var ns []string
	for _, o := range m.Objects {
		if o.GetKind() == "Namespace" {
			ns = append(ns, o.GetName())
		}
	}
	return ns
}

// Deployer applies manifests to one cluster.
type Deployer struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// New returns a Deployer for the cluster cfg points at (an identity allowed to create
// namespaces, CRDs, RBAC and workloads: cluster admin).
func New(cfg *rest.Config) (*Deployer, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Deployer{client: client, dyn: dyn,
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// Keys are the secrets of an installation (the Secret APIKeySecret).
type Keys struct {
	// APIKey is the OpenSandbox API key (header OPEN-SANDBOX-API-KEY).
	APIKey string
	// ExecdKey derives every sandbox's execd token ("base64:<32 bytes>").
	ExecdKey string
}

// Deploy applies m as the README's steps do: namespaces and CRDs, the API key Secret in
// systemNS (created with new random keys unless it exists, whose keys are kept), then
// every other object; it returns the keys in force. It does not wait for rollouts
// (WaitRollouts).
func (d *Deployer) Deploy(ctx context.Context, m *Manifest, systemNS string) (Keys, error) {
	var first, rest []*unstructured.Unstructured
	for _, o := range m.Objects {
		if k := o.GetKind(); k == "Namespace" || k == "CustomResourceDefinition" {
			first = append(first, o)
		} else {
			rest = append(rest, o)
		}
	}
	if err := d.apply(ctx, first); err != nil {
		return Keys{}, err
	}
	if err := d.waitEstablished(ctx, first); err != nil {
		return Keys{}, err
	}
	keys, err := d.ensureKeys(ctx, systemNS)
	if err != nil {
		return Keys{}, err
	}
	return keys, d.apply(ctx, rest)
}

// apply server-side applies each object with FieldManager, forcing conflicts (the
// manifests own their fields).
func (d *Deployer) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		mapping, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("apply %s %s: no resource for %s: %w", o.GetKind(), o.GetName(), gvk, err)
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = d.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = d.dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		force := true
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// waitEstablished waits until the CRDs among objs are served (their kinds map), then
// forgets the discovery cache.
func (d *Deployer) waitEstablished(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		for {
			d.mapper.Reset()
			if _, err := d.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind}); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not served: %w", o.GetName(), ctx.Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// ensureKeys creates the Secret APIKeySecret in ns with a random API key and execd key,
// or reads the keys of the one that exists.
func (d *Deployer) ensureKeys(ctx context.Context, ns string) (Keys, error) {
	secrets := d.client.CoreV1().Secrets(ns)
	s, err := secrets.Get(ctx, APIKeySecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		var api, execd [32]byte
		_, _ = rand.Read(api[:])
		_, _ = rand.Read(execd[:])
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: APIKeySecret},
			StringData: map[string]string{
				"api-key":   hex.EncodeToString(api[:]),
				"execd-key": "base64:" + base64.StdEncoding.EncodeToString(execd[:]),
			},
		}
		if s, err = secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return Keys{}, fmt.Errorf("creating Secret %s/%s: %w", ns, APIKeySecret, err)
		}
	} else if err != nil {
		return Keys{}, fmt.Errorf("reading Secret %s/%s: %w", ns, APIKeySecret, err)
	}
	k := Keys{APIKey: string(s.Data["api-key"]), ExecdKey: string(s.Data["execd-key"])}
	if k.APIKey == "" {
		return Keys{}, fmt.Errorf("Secret %s/%s has no api-key", ns, APIKeySecret)
	}
	return k, nil
}

// WaitRollouts waits until every Deployment and DaemonSet of m is rolled out: the
// controller saw the newest spec, and every desired replica (every scheduled pod of a
// DaemonSet) is updated and available. On ctx's end the error (ErrRollout) names what is
// missing and the waiting pods' states.
func (d *Deployer) WaitRollouts(ctx context.Context, m *Manifest) error {
	for _, o := range m.Objects {
		kind, ns, name := o.GetKind(), o.GetNamespace(), o.GetName()
		if kind != "Deployment" && kind != "DaemonSet" {
			continue
		}
		var state string
		for {
			done, s, err := d.rolledOut(ctx, kind, ns, name)
			if err != nil {
				return err
			}
			if done {
				break
			}
			state = s
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: %s %s/%s: %s\n%s", ErrRollout, kind, ns, name, state, d.podStates(ns, o))
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// rolledOut reports whether one workload is rolled out, and its progress in words.
func (d *Deployer) rolledOut(ctx context.Context, kind, ns, name string) (bool, string, error) {
	apps := d.client.AppsV1()
	switch kind {
	case "Deployment":
		w, err := apps.Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		want := int32(1)
		if w.Spec.Replicas != nil {
			want = *w.Spec.Replicas
		}
		st := w.Status
		return st.ObservedGeneration >= w.Generation && st.UpdatedReplicas == want && st.AvailableReplicas == want &&
				st.Replicas == want,
			fmt.Sprintf("%d of %d replicas updated, %d available", st.UpdatedReplicas, want, st.AvailableReplicas), nil
	default:
		w, err := apps.DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		st := w.Status
		return st.ObservedGeneration >= w.Generation && st.DesiredNumberScheduled > 0 &&
				st.UpdatedNumberScheduled == st.DesiredNumberScheduled && st.NumberAvailable == st.DesiredNumberScheduled,
			fmt.Sprintf("%d of %d pods updated, %d available", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable), nil
	}
}

// podStates describes the pods of workload o (its selector) for an error message.
func (d *Deployer) podStates(ns string, o *unstructured.Unstructured) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
	var parts []string
	for k, v := range sel {
		parts = append(parts, k+"="+v)
	}
	pods, err := d.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: strings.Join(parts, ",")})
	if err != nil {
		return "pods: " + err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "  pod %s: %s", p.Name, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case c.State.Waiting != nil:
				fmt.Fprintf(&b, "; %s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
			case c.State.Terminated != nil:
				fmt.Fprintf(&b, "; %s terminated: %s (exit %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			default:
				fmt.Fprintf(&b, "; %s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// NodePortAddr returns host:port of Service ns/name's first NodePort on the first node's
// InternalIP: where a client outside the cluster network reaches it.
func (d *Deployer) NodePortAddr(ctx context.Context, ns, name string) (string, error) {
	svc, err := d.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
		return "", fmt.Errorf("Service %s/%s has no NodePort (type %s)", ns, name, svc.Spec.Type)
	}
	nodes, err := d.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return net.JoinHostPort(a.Address, strconv.Itoa(int(svc.Spec.Ports[0].NodePort))), nil
			}
		}
	}
	return "", fmt.Errorf("no node with an InternalIP for Service %s/%s", ns, name)
}

// WaitServing waits until an HTTP server answers at each of addrs (host:port; any
// status counts): a rolled-out workload's Service is reachable only once the node's
// kube-proxy has programmed its ready endpoints, a moment after the rollout; until
// then a NodePort refuses connections. On ctx's end the error names the address and
// the last failure.
func WaitServing(ctx context.Context, addrs ...string) error {
	c := &http.Client{Timeout: 2 * time.Second}
	for _, addr := range addrs {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
			if err != nil {
				return err
			}
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s not serving: %w", addr, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
