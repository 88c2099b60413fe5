// Package kubestore keeps lifecycle's state in the Kubernetes API, so that any number
// of lifecycle replicas serve the same sandboxes: one airlock.dev/v1alpha1 Sandbox
// resource per sandbox (its access token in a Secret beside it), one Policy resource
// per named policy's applied version, the instance id in a ConfigMap, and a Lease
// through which exactly one replica leads (runs expiry, resync and reconcile).
//
// Each replica follows the others through informers (lifecycle.SharedStore.Follow).
// Writes are last-writer-wins: a write that meets a newer version of the resource
// (another replica's) retries on top of it. Requests for one sandbox normally reach one
// replica at a time; the leader's loops skip sandboxes busy with an operation.
package kubestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kubestore/v1alpha1"
	"github.com/airlockdev/airlock/policies/library"
)

// Resources of the airlock.dev API.
var (
	SandboxGVR = schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.Version, Resource: v1alpha1.SandboxResource}
	PolicyGVR  = schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.Version, Resource: v1alpha1.PolicyResource}
)

// instanceConfigMap holds the instance id every replica shares.
const instanceConfigMap = "airlock-lifecycle-instance"

// Config configures a Store.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace holds the Sandbox and Policy resources, the instance ConfigMap and the
	// Lease (the system namespace, not the sandboxes').
	Namespace string
	// SecretNamespace holds the access-token Secrets (one per sandbox, label
	// airlock.dev/access-token); default Namespace. A namespace of their own lets RBAC
	// give lifecycle list and watch on them without any Secret of the system namespace
	// (RBAC cannot grant by label): the deploy manifests use airlock-tokens.
	SecretNamespace string
	// Identity names this replica in the Lease; default the host name plus a random
	// suffix.
	Identity string
	// LeaseName is the Lease's name; default "airlock-lifecycle".
	LeaseName string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election (client-go's
	// meanings); defaults 15 s, 10 s, 2 s. A new leader takes over at most
	// LeaseDuration after the old one stopped renewing.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Leader, when its Service is set, is where this replica is reached while it
	// leads: Lead points the Service's EndpointSlice at it (leader.go).
	Leader LeaderEndpoint
	Log    *slog.Logger
}

// Store is a lifecycle.SharedStore and a library.Store over the Kubernetes API.
type Store struct {
	cfg  Config
	log  *slog.Logger
	sbx  dynamic.ResourceInterface
	pols dynamic.ResourceInterface

	instOnce sync.Once
	instance string
	instErr  error

	mu sync.Mutex
	// rv is the resource version of each Sandbox as this replica last wrote or saw
	// it (the base of its next update); own marks the versions this replica wrote,
	// whose informer events are its own echo.
	rv  map[string]string
	own map[string]uint64
	// tokens caches each sandbox's access token (the Secrets are immutable).
	tokens map[string]string
	// inflight counts this replica's writes under way per sandbox; an informer event
	// waits for them (signalled on written), so that an echo of a write is known as
	// one.
	inflight map[string]int
	written  *sync.Cond

	sbxInformer    cache.SharedIndexInformer
	secretInformer cache.SharedIndexInformer
	applyMu        sync.Mutex
}

var (
	_ lifecycle.SharedStore = (*Store)(nil)
	_ library.Store         = (*Store)(nil)
)

// New returns a Store; it performs no I/O.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil || cfg.Dynamic == nil || cfg.Namespace == "" {
		return nil, errors.New("kubestore: Client, Dynamic and Namespace are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.SecretNamespace == "" {
		cfg.SecretNamespace = cfg.Namespace
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = "airlock-lifecycle"
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = cfg.LeaseDuration * 2 / 3
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = cfg.RenewDeadline / 5
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = host + "-" + randomHex(4)
	}
	s := &Store{
		cfg:      cfg,
		log:      cfg.Log,
		sbx:      cfg.Dynamic.Resource(SandboxGVR).Namespace(cfg.Namespace),
		pols:     cfg.Dynamic.Resource(PolicyGVR).Namespace(cfg.Namespace),
		rv:       map[string]string{},
		own:      map[string]uint64{},
		tokens:   map[string]string{},
		inflight: map[string]int{},
	}
	s.written = sync.NewCond(&s.mu)
	return s, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// InstanceID returns the id shared by every replica (ConfigMap
// airlock-lifecycle-instance, created by the first replica).
func (s *Store) InstanceID() (string, error) {
	s.instOnce.Do(func() { s.instance, s.instErr = s.instanceID() })
	return s.instance, s.instErr
}

func (s *Store) instanceID() (string, error) {
	ctx, cancel := bg()
	defer cancel()
	cms := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace)
	for range 3 {
		cm, err := cms.Get(ctx, instanceConfigMap, metav1.GetOptions{})
		if err == nil && cm.Data["instance"] != "" {
			return cm.Data["instance"], nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("kubestore: instance id: %w", err)
		}
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: instanceConfigMap, Labels: map[string]string{"app.kubernetes.io/managed-by": "airlock"}},
			Data:       map[string]string{"instance": randomHex(6)},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("kubestore: instance id: %w", err)
		}
	}
	return "", errors.New("kubestore: instance id: the ConfigMap keeps changing")
}

// PutSandbox writes sandbox id's document: its access token (once) into the Secret
// airlock-access-<id>, everything else into the Sandbox resource <id>.
func (s *Store) PutSandbox(id string, doc []byte) error {
	inst, err := s.InstanceID()
	if err != nil {
		return err
	}
	obj, token, err := toObject(s.cfg.Namespace, inst, doc)
	if err != nil {
		return err
	}
	ctx, cancel := bg()
	defer cancel()
	if err := s.ensureToken(ctx, id, token); err != nil {
		return err
	}
	s.mu.Lock()
	rv := s.rv[id]
	s.inflight[id]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.inflight[id]--; s.inflight[id] <= 0 {
			delete(s.inflight, id)
		}
		s.written.Broadcast()
		s.mu.Unlock()
	}()
	var out *unstructured.Unstructured
	for attempt := 0; ; attempt++ {
		if rv == "" {
			out, err = s.sbx.Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				rv, err = s.currentRV(ctx, id)
				if err == nil {
					continue
				}
			}
		} else {
			obj.SetResourceVersion(rv)
			out, err = s.sbx.Update(ctx, obj, metav1.UpdateOptions{})
			if (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) && attempt < 5 {
				// Another replica wrote since: last writer wins, on top of its version.
				if rv, err = s.currentRV(ctx, id); err == nil {
					continue
				}
			}
		}
		break
	}
	if err != nil {
		return fmt.Errorf("kubestore: writing sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	s.rv[id] = out.GetResourceVersion()
	if v, err := strconv.ParseUint(out.GetResourceVersion(), 10, 64); err == nil {
		s.own[id] = v
	}
	s.mu.Unlock()
	return nil
}

// currentRV is the resource version of Sandbox id in the API, "" when it is missing.
func (s *Store) currentRV(ctx context.Context, id string) (string, error) {
	cur, err := s.sbx.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return cur.GetResourceVersion(), nil
}

func secretName(id string) string { return v1alpha1.AccessTokenPrefix + id }

// ensureToken creates the access-token Secret of id once.
func (s *Store) ensureToken(ctx context.Context, id, token string) error {
	if token == "" {
		return nil
	}
	s.mu.Lock()
	known := s.tokens[id] == token
	s.mu.Unlock()
	if known {
		return nil
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: secretName(id),
			Labels: map[string]string{
				v1alpha1.LabelAccessToken: "true", v1alpha1.LabelSandboxID: id,
				"app.kubernetes.io/managed-by": "airlock",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{v1alpha1.AccessTokenKey: []byte(token)},
	}
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace)
	_, err := secrets.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		// The error names the Secret, never its value.
		return fmt.Errorf("kubestore: writing the access token Secret of %s: %w", id, err)
	}
	s.mu.Lock()
	s.tokens[id] = token
	s.mu.Unlock()
	return nil
}

// DeleteSandbox deletes the Sandbox resource and the access-token Secret of id.
func (s *Store) DeleteSandbox(id string) error {
	ctx, cancel := bg()
	defer cancel()
	if err := s.sbx.Delete(ctx, id, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: deleting sandbox %s: %w", id, err)
	}
	err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).Delete(ctx, secretName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: deleting the access token Secret of %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.rv, id)
	delete(s.own, id)
	delete(s.tokens, id)
	s.mu.Unlock()
	return nil
}

// Sandboxes returns every sandbox document (from the informers' cache once Follow
// synced it, from the API otherwise).
func (s *Store) Sandboxes() (map[string][]byte, error) {
	var objs []*unstructured.Unstructured
	tokens := map[string]string{}
	if s.sbxInformer != nil {
		for _, o := range s.sbxInformer.GetStore().List() {
			objs = append(objs, o.(*unstructured.Unstructured))
		}
		for _, o := range s.secretInformer.GetStore().List() {
			sec := o.(*corev1.Secret)
			tokens[sec.Labels[v1alpha1.LabelSandboxID]] = string(sec.Data[v1alpha1.AccessTokenKey])
		}
	} else {
		ctx, cancel := bg()
		defer cancel()
		list, err := s.sbx.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubestore: listing sandboxes: %w", err)
		}
		for i := range list.Items {
			objs = append(objs, &list.Items[i])
		}
		secs, err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelAccessToken})
		if err != nil {
			return nil, fmt.Errorf("kubestore: listing access token Secrets: %w", err)
		}
		for _, sec := range secs.Items {
			tokens[sec.Labels[v1alpha1.LabelSandboxID]] = string(sec.Data[v1alpha1.AccessTokenKey])
		}
	}
	out := make(map[string][]byte, len(objs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range objs {
		id := o.GetName()
		doc, err := toDoc(o, tokens[id])
		if err != nil {
			return nil, err
		}
		out[id] = doc
		if _, ok := s.rv[id]; !ok {
			s.rv[id] = o.GetResourceVersion()
		}
		if t := tokens[id]; t != "" {
			s.tokens[id] = t
		}
	}
	return out, nil
}

// FetchSandbox reads sandbox id's document from the API server, bypassing the
// informers' cache: a replica asked about a sandbox another replica created a moment
// ago finds it before its watch delivers it. It returns nil (and no error) when the
// Sandbox resource does not exist.
func (s *Store) FetchSandbox(ctx context.Context, id string) ([]byte, error) {
	o, err := s.sbx.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kubestore: reading sandbox %s: %w", id, err)
	}
	token := ""
	sec, err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).Get(ctx, secretName(id), metav1.GetOptions{})
	switch {
	case err == nil:
		token = string(sec.Data[v1alpha1.AccessTokenKey])
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("kubestore: reading the access token of sandbox %s: %w", id, err)
	}
	doc, err := toDoc(o, token)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if _, ok := s.rv[id]; !ok {
		s.rv[id] = o.GetResourceVersion()
	}
	if token != "" {
		s.tokens[id] = token
	}
	s.mu.Unlock()
	return doc, nil
}

// Follow starts the informers on Sandbox resources and access-token Secrets and calls
// apply for every change not written by this Store. It returns once both are synced.
func (s *Store) Follow(ctx context.Context, apply func(id string, doc []byte)) error {
	df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.cfg.Dynamic, 0, s.cfg.Namespace, nil)
	s.sbxInformer = df.ForResource(SandboxGVR).Informer()
	kf := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0, informers.WithNamespace(s.cfg.SecretNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelAccessToken }))
	s.secretInformer = kf.Core().V1().Secrets().Informer()

	changed := func(obj any) {
		o, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		s.deliver(o, apply)
	}
	_, err := s.sbxInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(metav1.Object); ok {
				s.applyMu.Lock()
				defer s.applyMu.Unlock()
				s.mu.Lock()
				delete(s.rv, o.GetName())
				delete(s.own, o.GetName())
				s.mu.Unlock()
				apply(o.GetName(), nil)
			}
		},
	})
	if err != nil {
		return err
	}
	// A token that arrives after its Sandbox completes the document.
	_, err = s.secretInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			sec, ok := obj.(*corev1.Secret)
			if !ok {
				return
			}
			if o, ok, _ := s.sbxInformer.GetStore().GetByKey(s.cfg.Namespace + "/" + sec.Labels[v1alpha1.LabelSandboxID]); ok {
				s.deliver(o.(*unstructured.Unstructured), apply)
			}
		},
	})
	if err != nil {
		return err
	}
	go s.sbxInformer.Run(ctx.Done())
	go s.secretInformer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.sbxInformer.HasSynced, s.secretInformer.HasSynced) {
		return errors.New("kubestore: informers did not sync")
	}
	return nil
}

// deliver applies o unless this Store wrote it (or something newer) itself.
func (s *Store) deliver(o *unstructured.Unstructured, apply func(string, []byte)) {
	id := o.GetName()
	rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.mu.Lock()
	for s.inflight[id] > 0 {
		s.written.Wait()
	}
	if rv != 0 && rv <= s.own[id] {
		s.mu.Unlock()
		return
	}
	s.rv[id] = o.GetResourceVersion()
	s.mu.Unlock()
	token := ""
	if obj, ok, _ := s.secretInformer.GetStore().GetByKey(s.cfg.SecretNamespace + "/" + secretName(id)); ok {
		token = string(obj.(*corev1.Secret).Data[v1alpha1.AccessTokenKey])
	}
	doc, err := toDoc(o, token)
	if err != nil {
		s.log.Error("sandbox resource does not convert", "sandbox_id", id, "err", err)
		return
	}
	apply(id, doc)
}

// Lead campaigns for the Lease and calls lead while this replica holds it, again after
// every loss, until ctx ends; the Lease is released on the way out so that another
// replica takes over at once.
func (s *Store) Lead(ctx context.Context, lead func(ctx context.Context)) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: s.cfg.LeaseName, Namespace: s.cfg.Namespace},
		Client:     s.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   s.cfg.LeaseDuration,
			RenewDeadline:   s.cfg.RenewDeadline,
			RetryPeriod:     s.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            s.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					done := make(chan struct{})
					go func() { defer close(done); s.advertiseLeader(ctx) }()
					lead(ctx)
					<-done
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			s.log.Error("leader election", "err", err)
			return
		}
		le.Run(ctx)
	}
}

// Identity is this replica's name in the Lease.
func (s *Store) Identity() string { return s.cfg.Identity }

// policyObjectName maps a library policy name to a resource name: the name itself
// when it is a valid one, else "policy-" and a hash.
func policyObjectName(name string) string {
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return "policy-" + hex.EncodeToString(sum(name))[:16]
}

// LibraryVersions returns every named policy's applied version.
func (s *Store) LibraryVersions() (map[string]library.Stored, error) {
	ctx, cancel := bg()
	defer cancel()
	list, err := s.pols.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubestore: listing policies: %w", err)
	}
	out := map[string]library.Stored{}
	for _, item := range list.Items {
		var p v1alpha1.Policy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &p); err != nil {
			return nil, fmt.Errorf("kubestore: policy %s: %w", item.GetName(), err)
		}
		out[p.Spec.Name] = library.Stored{Version: p.Spec.Version, SHA256: p.Spec.SHA256, File: p.Spec.File, Source: p.Spec.Source}
	}
	return out, nil
}

// PutLibraryVersion records the applied version of named policy name.
func (s *Store) PutLibraryVersion(name string, st library.Stored) error {
	ctx, cancel := bg()
	defer cancel()
	p := v1alpha1.Policy{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.PolicyKind},
		ObjectMeta: metav1.ObjectMeta{Name: policyObjectName(name), Namespace: s.cfg.Namespace},
		Spec:       v1alpha1.PolicySpec{Name: name, Version: st.Version, SHA256: st.SHA256, File: st.File, Source: st.Source},
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: m}
	for range 5 {
		cur, err := s.pols.Get(ctx, obj.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = s.pols.Create(ctx, obj, metav1.CreateOptions{})
		case err == nil:
			obj.SetResourceVersion(cur.GetResourceVersion())
			_, err = s.pols.Update(ctx, obj, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("kubestore: writing policy %s: %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("kubestore: writing policy %s: kept conflicting", name)
}
