package cluster_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/internal/kubetest"
)

// recorder is an audit sink that keeps what it is given.
type recorder struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (r *recorder) Append(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

// ops are the extra.op of the control records received, in order.
func (r *recorder) ops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Source == audit.SourceControl {
			op, _ := rec.Extra["op"].(string)
			out = append(out, op)
		}
	}
	return out
}

// TestReplicaAudit runs a real control-plane replica (a real kube-apiserver with
// Airlock's CRDs) with Config.Audit set: a console sign-in, a key made through
// /v1/keys and a refused call each reach it as a control record; the console's audit
// pages still answer 501 (the replica's log is one of many).
func TestReplicaAudit(t *testing.T) {
	env := kubetest.Start(t, kubetest.AirlockCRDs())
	const apiKey = "audit-test-key"
	rec := &recorder{}
	cp, err := cluster.Start(t.Context(), cluster.Config{
		Kube: env.Config, Listen: "127.0.0.1:0", Namespace: env.Namespace(t, "sbx"), SystemNamespace: env.Namespace(t, "sys"),
		ExecdImage: "airlock/execd:test", APIKey: apiKey, Identity: "audited", LeaseDuration: 2 * time.Second,
		Audit: rec, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Close() })
	base := "http://" + cp.Addr.String()

	admin := signIn(t, base, apiKey)
	if code, body := get(t, admin, base+"/console/api/audit"); code != 501 {
		t.Fatalf("audit search as the admin on Kubernetes: %d %s, want 501", code, body)
	}
	if code, _, _ := postKey(t, base, apiKey, "carol", "operator"); code != http.StatusCreated {
		t.Fatalf("POST /v1/keys: %d", code)
	}
	req, _ := http.NewRequest("DELETE", base+"/v1/sandboxes/nope", nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", "wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	got := strings.Join(rec.ops(), " ")
	for _, want := range []string{"console.sign_in", "key.create", "sandbox.delete"} {
		if !strings.Contains(got, want) {
			t.Errorf("control records %q: no %s", got, want)
		}
	}
}
