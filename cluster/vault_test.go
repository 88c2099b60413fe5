package cluster

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestNodeVault: the CA made at create reaches the node's egressd (the pod's hostIP)
// with the API key, once, before install reports true; the vault routes are forwarded
// there and answered back; Delete reaches the node.
func TestNodeVault(t *testing.T) {
	const id, key = "sbx1", "the-api-key"
	var mu sync.Mutex
	var got []string
	var ca watch.VaultCA
	known := false
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get(opensandbox.HeaderAPIKey) != key {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		got = append(got, r.Method+" "+r.URL.Path)
		switch {
		case !known:
			w.WriteHeader(http.StatusNotFound) // the node's watch has not delivered it
		case strings.HasSuffix(r.URL.Path, "/ca"):
			_ = json.NewDecoder(r.Body).Decode(&ca)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		default:
			b, _ := io.ReadAll(r.Body)
			opensandbox.WriteJSON(w, http.StatusCreated, map[string]string{"echo": string(b)})
		}
	}))
	defer node.Close()
	host, port, _ := net.SplitHostPort(node.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	cs := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: kube.PodName(id), Namespace: "sbx"},
		Status: corev1.PodStatus{HostIP: host}})
	v := newNodeVault(newEnforcementGate(cs, "sbx", p), key, slog.New(slog.DiscardHandler))

	cert, _, pemCert, err := v.CA(id)
	if err != nil || !cert.IsCA || !strings.Contains(string(pemCert), "CERTIFICATE") {
		t.Fatalf("CA: %v %v", cert, err)
	}
	if v.install(id) {
		t.Fatal("install reported the CA handed over while the node did not know the sandbox")
	}
	mu.Lock()
	known = true
	mu.Unlock()
	if !v.install(id) || string(ca.Cert) != string(cert.Raw) || len(ca.Key) == 0 {
		t.Fatal("install did not hand the node the sandbox's CA")
	}
	if !v.install(id) {
		t.Fatal("install after the hand-over is not true")
	}

	rec := httptest.NewRecorder()
	v.ServeAPI(rec, httptest.NewRequest(http.MethodPost, "/credential-vault", strings.NewReader(`{"x":1}`)), id, "/credential-vault", nil)
	if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `{\"x\":1}`) {
		t.Errorf("forwarded create: %d %s", rec.Code, rec.Body)
	}
	if err := v.Delete(id); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"PUT " + watch.VaultPath + id + "/ca", "PUT " + watch.VaultPath + id + "/ca",
		"POST " + watch.VaultPath + id + "/credential-vault", "DELETE " + watch.VaultPath + id}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("node saw %q, want %q", got, want)
	}
}

// TestNodeVaultSnapshotCopy: a capture has the source's node copy its vault to the
// snapshot at once (POST copy with the API key); a restore's copy waits for the new
// sandbox's pod and is done by install after its CA, once; Delete of the snapshot
// reaches the node it was captured on; a copy between two sandboxes is refused without
// a request, and a node's refusal fails the capture.
func TestNodeVaultSnapshotCopy(t *testing.T) {
	const src, restored, snap, key = "srcsbx", "restsbx", "snap-abc", "the-api-key"
	var mu sync.Mutex
	var got []string
	knowRestored, failCopy := false, false
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get(opensandbox.HeaderAPIKey) != key {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		line := r.Method + " " + r.URL.Path
		if r.URL.Path == watch.VaultPath+"copy" {
			var c watch.VaultCopy
			_ = json.NewDecoder(r.Body).Decode(&c)
			line += " " + c.From + ">" + c.To
			if failCopy {
				opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL_ERROR", Message: "disk full"})
				got = append(got, line)
				return
			}
			if c.To == restored && !knowRestored {
				opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "not here"})
				got = append(got, line)
				return
			}
		}
		got = append(got, line)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer node.Close()
	host, port, _ := net.SplitHostPort(node.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	pod := func(id string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: kube.PodName(id), Namespace: "sbx"}, Status: corev1.PodStatus{HostIP: host}}
	}
	cs := fake.NewClientset(pod(src), pod(restored))
	v := newNodeVault(newEnforcementGate(cs, "sbx", p), key, slog.New(slog.DiscardHandler))
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}

	if err := v.CopyVault(src, snap); err != nil {
		t.Fatalf("capture copy: %v", err)
	}
	if g, want := seen(), []string{"POST " + watch.VaultPath + "copy " + src + ">" + snap}; strings.Join(g, ",") != strings.Join(want, ",") {
		t.Errorf("capture: node saw %q, want %q", g, want)
	}

	// Restore: the CA is made at create, the copy asked for before the pod runs.
	if _, _, _, err := v.CA(restored); err != nil {
		t.Fatal(err)
	}
	if err := v.CopyVault(snap, restored); err != nil {
		t.Fatalf("restore copy: %v", err)
	}
	if g := seen(); len(g) != 0 {
		t.Errorf("the restore's copy reached the node before install: %q", g)
	}
	if v.install(restored) {
		t.Error("install reported done while the node refused the copy")
	}
	mu.Lock()
	knowRestored = true
	mu.Unlock()
	if !v.install(restored) || !v.install(restored) {
		t.Error("install did not finish the restore's copy")
	}
	want := []string{"PUT " + watch.VaultPath + restored + "/ca", "POST " + watch.VaultPath + "copy " + snap + ">" + restored,
		"POST " + watch.VaultPath + "copy " + snap + ">" + restored}
	if g := seen(); strings.Join(g, ",") != strings.Join(want, ",") {
		t.Errorf("restore: node saw %q, want %q (the CA once, then the copy until it is done)", g, want)
	}

	if err := v.Delete(snap); err != nil {
		t.Fatal(err)
	}
	if g, want := seen(), []string{"DELETE " + watch.VaultPath + snap}; strings.Join(g, ",") != strings.Join(want, ",") {
		t.Errorf("snapshot delete: node saw %q, want %q", g, want)
	}
	if err := v.Delete("snap-unknown"); err != nil {
		t.Errorf("deleting a snapshot captured elsewhere: %v", err)
	}
	if err := v.CopyVault(src, restored); err == nil {
		t.Error("a copy between two sandboxes was accepted")
	}
	mu.Lock()
	failCopy = true
	mu.Unlock()
	if err := v.CopyVault(src, "snap-def"); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("a capture the node refused: %v, want its error", err)
	}
	if g := seen(); len(g) != 1 {
		t.Errorf("after the refused capture the node saw %q, want only that copy", g)
	}
}
