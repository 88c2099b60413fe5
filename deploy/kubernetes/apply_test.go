package manifests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/airlockdev/airlock/internal/kubetest"
)

// applied are the kinds applied for real: what the dry run of the others needs
// (namespaces, CRDs) and what SubjectAccessReviews read (RBAC).
var applied = map[string]bool{
	"Namespace": true, "CustomResourceDefinition": true, "ServiceAccount": true,
	"Role": true, "RoleBinding": true, "ClusterRole": true, "ClusterRoleBinding": true,
}

// warnings collects the API server's warnings (deprecated APIs, Pod Security).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// TestApplyAndAccess applies every rendered object to a real kube-apiserver with
// server-side apply (a dry run, except namespaces, CRDs and RBAC, which are created
// for real first), and checks each component's ServiceAccount with
// SubjectAccessReviews: every call it makes is allowed, samples it must not make
// are denied.
func TestApplyAndAccess(t *testing.T) {
	env := kubetest.Shared(t)
	cfg := rest.CopyConfig(env.Config)
	warn := &warnings{}
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, l := range layouts {
		t.Run(filepath.Base(l.dir), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			m := render(t, l.dir)
			// Namespaces and CRDs first, for real, then wait until the CRDs are served.
			for _, o := range m.objs {
				if k := o.GetKind(); k == "Namespace" || k == "CustomResourceDefinition" {
					apply(ctx, t, dyn, mapper, o, false)
				}
			}
			waitServed(ctx, t, mapper, m)
			for _, o := range m.objs {
				if k := o.GetKind(); k != "Namespace" && k != "CustomResourceDefinition" {
					apply(ctx, t, dyn, mapper, o, !applied[k])
				}
			}
			if w := warn.take(); len(w) > 0 {
				t.Errorf("the API server warned: %q", w)
			}
			checkAccess(ctx, t, env, l)
			checkSandboxNamespaceEnforces(ctx, t, env, m, l)
		})
	}
	t.Run("pod-security", func(t *testing.T) { checkPodSecurity(t, env) })
}

// checkPodSecurity creates (dry run) a pod from each workload's template where Pod
// Security admission enforces on pods: lifecycle and gateway pass "restricted";
// egressd passes its namespace's level and needs it ("baseline" refuses it).
func checkPodSecurity(t *testing.T, env *kubetest.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := render(t, "base")
	level := func(l string) string {
		ns, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			GenerateName: "psa-" + l + "-",
			Labels:       map[string]string{"pod-security.kubernetes.io/enforce": l},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
		})
		return ns.Name
	}
	restricted, baseline := level("restricted"), level("baseline")
	sysNS := typed[corev1.Namespace](t, m.find("Namespace", "", "airlock-system")).Labels["pod-security.kubernetes.io/enforce"]
	system := level(sysNS)
	create := func(ns string, tpl corev1.PodTemplateSpec) error {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-", Labels: tpl.Labels}, Spec: tpl.Spec}
		_, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	for _, name := range []string{"airlock-lifecycle", "airlock-gateway"} {
		d := typed[appsv1.Deployment](t, m.find("Deployment", "airlock-system", name))
		if err := create(restricted, d.Spec.Template); err != nil {
			t.Errorf("%s: pods must pass Pod Security \"restricted\": %v", name, err)
		}
	}
	e := typed[appsv1.DaemonSet](t, m.find("DaemonSet", "airlock-system", "airlock-egressd"))
	if err := create(system, e.Spec.Template); err != nil {
		t.Errorf("egressd: pods refused in airlock-system (%q): %v", sysNS, err)
	}
	if err := create(baseline, e.Spec.Template); err == nil {
		t.Error("egressd passes \"baseline\": then airlock-system should enforce it")
	}
}

// checkSandboxNamespaceEnforces: the layout's sandbox namespace, as applied, refuses a
// pod that needs more than "baseline" (egressd's template: hostNetwork, host paths,
// capabilities), so no sandbox pod can ever run privileged there.
func checkSandboxNamespaceEnforces(ctx context.Context, t *testing.T, env *kubetest.Env, m *manifest, l layout) {
	t.Helper()
	e := typed[appsv1.DaemonSet](t, m.find("DaemonSet", l.system, "airlock-egressd"))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-"}, Spec: e.Spec.Template.Spec}
	pod.Spec.ServiceAccountName = ""
	_, err := env.Client.CoreV1().Pods(l.sandboxes).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("sandbox namespace %s admitted a privileged pod (want a PodSecurity refusal): %v", l.sandboxes, err)
	}
}

// applyForReal applies m's namespaces, CRDs, ServiceAccounts and RBAC (not dry run),
// for tests that run a component against them.
func applyForReal(ctx context.Context, t *testing.T, env *kubetest.Env, m *manifest) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, o := range m.objs {
		if k := o.GetKind(); k == "Namespace" || k == "CustomResourceDefinition" {
			apply(ctx, t, dyn, mapper, o, false)
		}
	}
	waitServed(ctx, t, mapper, m)
	for _, o := range m.objs {
		if k := o.GetKind(); applied[k] && k != "Namespace" && k != "CustomResourceDefinition" {
			apply(ctx, t, dyn, mapper, o, false)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// apply server-side applies o (dryRun: validation and admission only, nothing stored).
func apply(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured, dryRun bool) {
	t.Helper()
	gvk := o.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Errorf("%s: no resource for %s: %v", key(o), gvk, err)
		return
	}
	data, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: "airlock-test", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == "namespace" {
		ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
	}
	if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts); err != nil {
		t.Errorf("apply %s (dry run %v): %v", key(o), dryRun, err)
	}
}

// waitServed waits until the API server serves every CRD of m (discovery lags the
// CRD's creation by a moment).
func waitServed(ctx context.Context, t *testing.T, mapper *restmapper.DeferredDiscoveryRESTMapper, m *manifest) {
	t.Helper()
	for _, o := range m.ofKind("CustomResourceDefinition") {
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		gk := schema.GroupKind{Group: group, Kind: kind}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			if _, err := mapper.RESTMapping(gk); err == nil {
				return true, nil
			}
			mapper.Reset()
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not served: %v", o.GetName(), err)
		}
	}
}

// access is one request a ServiceAccount may or may not make.
type access struct {
	verb, group, resource, subresource, namespace, name string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.name != "" {
		r += " " + a.name
	}
	ns := a.namespace
	if ns == "" {
		ns = "(cluster-wide)"
	}
	return fmt.Sprintf("%s %s in %s", a.verb, r, ns)
}

func verbs(group, resource, ns string, vs ...string) []access {
	out := make([]access, len(vs))
	for i, v := range vs {
		out[i] = access{verb: v, group: group, resource: resource, namespace: ns}
	}
	return out
}

// lifecycleCalls are the requests lifecycle makes (lifecycle/kubestore in the system
// and token namespaces, lifecycle/kube in the sandbox namespace).
func lifecycleCalls(sys, sbx, tok string) []access {
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	return slices.Concat(
		verbs("airlock.dev", "sandboxes", sys, all...),
		verbs("airlock.dev", "policies", sys, all...),
		[]access{{verb: "update", group: "airlock.dev", resource: "sandboxes", subresource: "status", namespace: sys}},
		verbs("", "secrets", tok, "get", "list", "watch", "create", "update", "delete"),
		[]access{
			{verb: "create", resource: "configmaps", namespace: sys},
			{verb: "get", resource: "configmaps", namespace: sys, name: "airlock-lifecycle-instance"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: sys},
			{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "airlock-lifecycle"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "airlock-lifecycle"},
			// Snapshots: the egressd pod of a snapshot's node, whose address removes it.
			{verb: "list", resource: "pods", namespace: sys},
		},
		verbs("", "pods", sbx, "get", "list", "watch", "create", "delete"),
		verbs("", "secrets", sbx, "get", "create", "patch", "delete"),
		verbs("networking.k8s.io", "networkpolicies", sbx, all...),
		verbs("agents.x-k8s.io", "sandboxes", sbx, "get", "list", "watch", "create", "delete"),
	)
}

// lifecycleDenied are samples lifecycle must not be able to do. No Secret of the
// system namespace: the operator's API key Secret is there (the kubelet hands it to
// the pods that name it).
func lifecycleDenied(sys, sbx, tok string) []access {
	a := []access{
		{verb: "get", resource: "secrets", namespace: sys, name: "airlock-api-key"},
		{verb: "list", resource: "secrets", namespace: sys},
		{verb: "watch", resource: "secrets", namespace: sys},
		{verb: "update", resource: "secrets", namespace: sys, name: "airlock-api-key"},
		{verb: "delete", resource: "secrets", namespace: sys, name: "airlock-api-key"},
		{verb: "create", resource: "secrets", namespace: sys},
		{verb: "create", resource: "pods", namespace: tok},
		{verb: "list", resource: "secrets"},
		{verb: "get", resource: "secrets", namespace: "kube-system"},
		{verb: "create", resource: "pods", namespace: "kube-system"},
		{verb: "list", resource: "pods", namespace: "default"},
		{verb: "get", group: "airlock.dev", resource: "sandboxes", namespace: "default"},
		{verb: "list", group: "airlock.dev", resource: "sandboxes"},
		{verb: "create", resource: "pods", subresource: "exec", namespace: sbx},
		{verb: "update", resource: "pods", namespace: sbx},
		{verb: "list", resource: "nodes"},
		{verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: sys},
		{verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: sys, name: "kube-controller-manager"},
		{verb: "get", resource: "configmaps", namespace: sys, name: "airlock-settings"},
		{verb: "delete", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "sandboxes.airlock.dev"},
	}
	return append(a,
		access{verb: "create", resource: "pods", namespace: sys},
		access{verb: "list", resource: "secrets", namespace: sbx},
		access{verb: "get", group: "airlock.dev", resource: "sandboxes", namespace: sbx},
	)
}

// noAPIDenied are samples for the components that have no API access at all.
func noAPIDenied(sys, sbx, tok string) []access {
	return []access{
		{verb: "list", resource: "secrets", namespace: tok},
		{verb: "get", resource: "pods", namespace: sys},
		{verb: "list", resource: "pods", namespace: sbx},
		{verb: "watch", resource: "pods"},
		{verb: "get", resource: "secrets", namespace: sys, name: "airlock-api-key"},
		{verb: "list", resource: "secrets"},
		{verb: "get", resource: "configmaps", namespace: sys},
		{verb: "list", group: "airlock.dev", resource: "sandboxes", namespace: sys},
		{verb: "get", group: "airlock.dev", resource: "policies", namespace: sys},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: sys},
		{verb: "list", resource: "services", namespace: sys},
		{verb: "list", resource: "nodes"},
		{verb: "create", group: "networking.k8s.io", resource: "networkpolicies", namespace: sbx},
	}
}

func checkAccess(ctx context.Context, t *testing.T, env *kubetest.Env, l layout) {
	t.Helper()
	sys, sbx, tok := l.system, l.sandboxes, l.tokens
	for _, a := range lifecycleCalls(sys, sbx, tok) {
		wantAllowed(ctx, t, env, sys, "airlock-lifecycle", a)
	}
	// Denials are checked once the grants above are visible to the authorizer (its
	// RBAC cache follows the API), so a denial is not a stale cache.
	for _, a := range lifecycleDenied(sys, sbx, tok) {
		wantDenied(ctx, t, env, sys, "airlock-lifecycle", a)
	}
	for _, sa := range []string{"airlock-gateway", "airlock-egressd"} {
		for _, a := range noAPIDenied(sys, sbx, tok) {
			wantDenied(ctx, t, env, sys, sa, a)
		}
	}
}

func review(ctx context.Context, env *kubetest.Env, ns, sa string, a access) (*authzv1.SubjectAccessReviewStatus, error) {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource,
			Subresource: a.subresource, Name: a.name,
		},
	}}
	out, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return &out.Status, nil
}

// wantAllowed waits (up to 10 s, for the authorizer's RBAC cache) until sa may do a.
func wantAllowed(ctx context.Context, t *testing.T, env *kubetest.Env, ns, sa string, a access) {
	t.Helper()
	var last *authzv1.SubjectAccessReviewStatus
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := review(ctx, env, ns, sa, a)
		if err != nil {
			return false, err
		}
		last = st
		return st.Allowed, nil
	})
	if err != nil {
		t.Errorf("%s/%s must be allowed to %s: %v (%+v)", ns, sa, a, err, last)
	}
}

func wantDenied(ctx context.Context, t *testing.T, env *kubetest.Env, ns, sa string, a access) {
	t.Helper()
	st, err := review(ctx, env, ns, sa, a)
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	if st.Allowed {
		t.Errorf("%s/%s must not be allowed to %s (%s)", ns, sa, a, strings.TrimSpace(st.Reason))
	}
}
