package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlockdev/airlock/internal/kubedeploy"
)

// egressdDaemonSet and egressdSelector name the node's egressd: the DaemonSet of
// deploy/kubernetes/base/egressd.yaml and the label of its pods.
const (
	egressdDaemonSet = "airlock-egressd"
	egressdSelector  = "app.kubernetes.io/name=airlock-egressd"
)

// vaultPlainHTTPFlag is egressd's flag for airlock.yaml's vault.plainHTTP
// (cmd/airlock/egressd.go: learned or policy).
const vaultPlainHTTPFlag = "--vault-plain-http="

// controlTimeout bounds one restart or reconfiguration: the old pods gone and the
// DaemonSet's new pods Ready (egressd's readiness: its first watch snapshot programmed).
const controlTimeout = 3 * time.Minute

// egressdControl is the control interface of tests/sdk/harness.mjs's external-server
// mode (AIRLOCK_SDK_CONTROL) for Airlock on the node: what a suite does to the
// `airlock up` of its own (read its log, restart it, restart it with another
// configuration) done to the node's egressd, which holds the Credential Vault (its
// sealed store in the hostPath StateDir/egressd/vault) and the datapath. HTTP on
// loopback, one request at a time:
//   - GET /log: 200, text/plain: the logs of every egressd pod, each after a line
//     "--- pod NAME";
//   - POST /restart: deletes every egressd pod and answers 204 once the DaemonSet's
//     new pods are Ready;
//   - POST /reconfigure?vaultPlainHTTP=learned|policy: sets egressd's
//     --vault-plain-http in the DaemonSet's pod template and answers 204 once the
//     rollout is done (at once when the flag already has that value).
//
// Errors answer 400 (an unknown value) or 500 (the cluster's), the reason as text. The
// DaemonSet's args as they were when the control started are restored at the end of
// the test that started it (startControl).
type egressdControl struct {
	n    *Node
	mu   sync.Mutex // one request at a time
	args []string   // the egressd container's args when the control started
}

// startControl serves egressdControl for n on 127.0.0.1 until t ends and returns its
// base URL (AIRLOCK_SDK_CONTROL); at the end of t the egressd DaemonSet's args are put
// back as they were and its rollout awaited (a failure fails t).
func startControl(t *testing.T, n *Node) string {
	t.Helper()
	ctx := context.Background()
	ds, err := n.Client.AppsV1().DaemonSets(kubedeploy.SystemNamespace).Get(ctx, egressdDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the egressd DaemonSet: %v", err)
	}
	c := &egressdControl{n: n, args: slices.Clone(ds.Spec.Template.Spec.Containers[0].Args)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /log", c.serveLog)
	mux.HandleFunc("POST /restart", c.serveRestart)
	mux.HandleFunc("POST /reconfigure", c.serveReconfigure)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
		defer cancel()
		if err := c.setArgs(ctx, c.args); err != nil {
			t.Errorf("restoring egressd's args: %v", err)
		}
	})
	return srv.URL
}

func (c *egressdControl) serveLog(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pods, err := c.pods(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var b strings.Builder
	for _, p := range pods {
		raw, err := c.n.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "egressd"}).DoRaw(r.Context())
		if err != nil {
			http.Error(w, fmt.Sprintf("the log of %s: %v", p.Name, err), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(&b, "--- pod %s\n%s", p.Name, raw)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

func (c *egressdControl) serveRestart(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), controlTimeout)
	defer cancel()
	pods, err := c.pods(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var gone []string
	for _, p := range pods {
		if err := c.n.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			http.Error(w, fmt.Sprintf("deleting %s: %v", p.Name, err), http.StatusInternalServerError)
			return
		}
		gone = append(gone, p.Name)
	}
	if err := c.waitReplaced(ctx, gone); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (c *egressdControl) serveReconfigure(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := r.URL.Query()
	mode := q.Get("vaultPlainHTTP")
	if len(q) != 1 || (mode != "learned" && mode != "policy") {
		http.Error(w, "want exactly vaultPlainHTTP=learned or vaultPlainHTTP=policy", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), controlTimeout)
	defer cancel()
	args := slices.DeleteFunc(slices.Clone(c.args), func(a string) bool { return strings.HasPrefix(a, vaultPlainHTTPFlag) })
	if err := c.setArgs(ctx, append(args, vaultPlainHTTPFlag+mode)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pods lists the egressd pods that are not being deleted.
func (c *egressdControl) pods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := c.n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: egressdSelector})
	if err != nil {
		return nil, fmt.Errorf("egressd pods: %w", err)
	}
	return slices.DeleteFunc(l.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil }), nil
}

// setArgs sets the egressd container's args in the DaemonSet's pod template (a JSON
// patch) and waits until every pod that ran the old ones is replaced by a Ready one;
// it does nothing when the args are already args.
func (c *egressdControl) setArgs(ctx context.Context, args []string) error {
	ds, err := c.n.Client.AppsV1().DaemonSets(kubedeploy.SystemNamespace).Get(ctx, egressdDaemonSet, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the egressd DaemonSet: %w", err)
	}
	if slices.Equal(ds.Spec.Template.Spec.Containers[0].Args, args) {
		return nil
	}
	old, err := c.pods(ctx)
	if err != nil {
		return err
	}
	patch, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/spec/template/spec/containers/0/name", "value": "egressd"},
		{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args},
	})
	if _, err := c.n.Client.AppsV1().DaemonSets(kubedeploy.SystemNamespace).Patch(ctx, egressdDaemonSet,
		types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching the egressd DaemonSet's args: %w", err)
	}
	gone := make([]string, 0, len(old))
	for _, p := range old {
		gone = append(gone, p.Name)
	}
	return c.waitReplaced(ctx, gone)
}

// waitReplaced waits until the egressd DaemonSet is rolled out (its status observes
// its generation, every scheduled pod updated and available) and its pods are the
// scheduled number, each Ready and none of them named in gone (nor being deleted).
func (c *egressdControl) waitReplaced(ctx context.Context, gone []string) error {
	var state string
	for {
		ds, err := c.n.Client.AppsV1().DaemonSets(kubedeploy.SystemNamespace).Get(ctx, egressdDaemonSet, metav1.GetOptions{})
		if err == nil {
			st := ds.Status
			state = fmt.Sprintf("%d of %d pods updated, %d available", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
			pods, perr := c.pods(ctx)
			err = perr
			done := st.ObservedGeneration >= ds.Generation && st.DesiredNumberScheduled > 0 &&
				st.UpdatedNumberScheduled == st.DesiredNumberScheduled && st.NumberAvailable == st.DesiredNumberScheduled &&
				len(pods) == int(st.DesiredNumberScheduled)
			for _, p := range pods {
				done = done && ready(&p) && !slices.Contains(gone, p.Name)
			}
			if err == nil && done {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("egressd not replaced (%s; last error %v): %w", state, err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
