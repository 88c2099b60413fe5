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
