package manifests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/internal/kubetest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestLifecycleWithItsRole runs a real lifecycle replica (package cluster, what
// `airlock lifecycle` runs) as the manifests' airlock-lifecycle ServiceAccount
// (impersonated) with the base's settings: it must take the Lease, create a sandbox's
// objects and delete them without one refusal, so the Roles grant what the code calls.
func TestLifecycleWithItsRole(t *testing.T) {
	env := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := render(t, "base")
	applyForReal(ctx, t, env, m)

	policyDir := t.TempDir()
	for _, cm := range m.ofKind("ConfigMap") {
		if strings.HasPrefix(cm.GetName(), "airlock-policies") {
			data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			for f, text := range data {
				if err := os.WriteFile(filepath.Join(policyDir, f), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	const sys, sbx, tok = "airlock-system", "airlock-sandboxes", "airlock-tokens"
	kc := rest.CopyConfig(env.Config)
	kc.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + sys + ":airlock-lifecycle",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + sys, "system:authenticated"},
	}
	logs := &testenv.SyncBuffer{}
	identity := fmt.Sprintf("manifests-test-%d", time.Now().UnixNano())
	cp, err := cluster.Start(ctx, cluster.Config{
		Kube: kc, Listen: "127.0.0.1:0", Namespace: sbx, SystemNamespace: sys, TokenNamespace: tok,
		NoAuth: true, ExecdImage: "airlock/execd:0.1.0", DNS: []netip.Addr{netip.MustParseAddr("169.254.20.10")},
		PolicyDir: policyDir, Identity: identity, LeaseDuration: 3 * time.Second, ReadyTimeout: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("lifecycle as its ServiceAccount: %v\n%s", err, logs)
	}
	defer cp.Close()
	defer func() {
		if t.Failed() {
			t.Logf("lifecycle log:\n%s", logs)
		}
	}()

	// The Lease: create, get, update.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := env.Client.CoordinationV1().Leases(sys).Get(ctx, "airlock-lifecycle", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == identity, nil
	})
	if err != nil {
		t.Fatalf("the replica never held the Lease %s/airlock-lifecycle: %v", sys, err)
	}

	base := "http://" + cp.Addr.String() + "/v1"
	body := `{"image":{"uri":"airlock/sandbox:latest"},"entrypoint":["tail","-f","/dev/null"],"timeout":600,` +
		`"resourceLimits":{"cpu":"500m","memory":"512Mi"},"metadata":{"suite":"manifests"}}`
	resp, err := http.Post(base+"/sandboxes", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || err != nil || created.ID == "" {
		t.Fatalf("create: %s %v", resp.Status, err)
	}
	sel := metav1.ListOptions{LabelSelector: "airlock.dev/sandbox-id=" + created.ID}
	pods, err := env.Client.CoreV1().Pods(sbx).List(ctx, sel)
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the sandbox's pod in %s: %v %v", sbx, pods, err)
	}
	nps, err := env.Client.NetworkingV1().NetworkPolicies(sbx).List(ctx, sel)
	if err != nil || len(nps.Items) != 1 {
		t.Errorf("the sandbox's NetworkPolicy in %s: %d, %v", sbx, len(nps.Items), err)
	}
	// Its access token is a Secret in the token namespace, none in the system namespace.
	toks, err := env.Client.CoreV1().Secrets(tok).List(ctx, sel)
	if err != nil || len(toks.Items) != 1 {
		t.Errorf("the sandbox's access-token Secret in %s: %v %v", tok, toks, err)
	}
	if sys, _ := env.Client.CoreV1().Secrets(sys).List(ctx, sel); sys != nil && len(sys.Items) != 0 {
		t.Errorf("an access-token Secret in the system namespace: %v", sys.Items)
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, base+"/sandboxes/"+created.ID, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("delete: %s", resp.Status)
	}
	// A pod bound to no node goes at once; nothing of the sandbox may be left.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Pods(sbx).Get(ctx, pods.Items[0].Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("the sandbox's pod is still there after delete: %v", err)
	}
	if nps, _ := env.Client.NetworkingV1().NetworkPolicies(sbx).List(ctx, sel); nps != nil && len(nps.Items) != 0 {
		t.Errorf("the sandbox's NetworkPolicy is still there after delete")
	}
	if s := logs.String(); strings.Contains(strings.ToLower(s), "forbidden") {
		t.Errorf("lifecycle was refused a request by the API server (its Roles lack a permission):\n%s", s)
	}
}
