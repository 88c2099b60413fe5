package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/sdk"
)

// TestSnapshotVaultOnNode: a snapshot of a credentialProxy sandbox carries its Credential
// Vault on Kubernetes. The source's vault binds a bearer secret to a project-owned HTTPS
// server; its snapshot turns Ready and the node's egressd keeps a sealed copy keyed by
// the snapshot id (a file in its vault folder without the secret in clear); the source
// is deleted (its vault file goes); a restore by snapshotId alone has, through the
// egress API, the binding without its value, and its request through egressd's L7
// proxy reaches the server with the secret injected; deleting the snapshot removes the
// node's copy, and the restored sandbox keeps its own vault.
func TestSnapshotVaultOnNode(t *testing.T) {
	upstreamCA := trustTestCA(t)
	n, a, c := deployed(t, 60)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := n.Namespace(t, "snapvault")
	const addr = "198.51.100.7"
	name := dnsName(t, n, ns, "vaultsnap", addr)
	authorizations := vaultUpstream(t, upstreamCA, name, addr)
	vaultDir := filepath.Join(StateDir, "egressd", "vault")
	res := map[string]string{"cpu": "250m", "memory": "256Mi"}

	secret := "kubenode-snapshot-secret-" + randomHex(t)
	policy := fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, name)
	src, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, NetworkPolicy: json.RawMessage(policy), CredentialProxy: true,
		Resources: res, Entrypoint: []string{"tail", "-f", "/dev/null"},
	})
	if err != nil {
		t.Fatalf("create the credentialProxy sandbox: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), src.ID) })
	waitExecd(ctx, t, c, src.ID)
	sv, err := c.Vault(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sv.Create(ctx, vault.CreateRequest{
		Credentials: []vault.Credential{{Name: "api", Source: vault.Source{Type: "inline", Value: secret}}},
		Bindings:    []vault.Binding{{Name: "api", Match: vault.Match{Hosts: []string{name}}, Auth: vault.Auth{Type: "bearer", Credential: "api"}}},
	}); err != nil {
		t.Fatalf("creating the source's vault through the egress API: %v", err)
	}

	// The snapshot: Ready, with the node's sealed copy under its id.
	var snap struct {
		ID     string `json:"id"`
		Status struct{ State, Reason, Message string }
	}
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]string{"name": "with-vault"}, &snap); code != http.StatusAccepted {
		t.Fatalf("POST snapshots: HTTP %d, want 202", code)
	}
	id := snap.ID
	n.Wait(t, "the snapshot to leave Creating", 5*time.Minute, func() (bool, error) {
		if code := apiCall(ctx, t, a, http.MethodGet, "/snapshots/"+id, nil, &snap); code != http.StatusOK {
			return false, fmt.Errorf("GET snapshot: HTTP %d", code)
		}
		return snap.Status.State != "Creating", nil
	})
	if snap.Status.State != "Ready" {
		t.Fatalf("snapshot %s is %s (%s: %s), want Ready", id, snap.Status.State, snap.Status.Reason, snap.Status.Message)
	}
	copyFile := filepath.Join(vaultDir, id+".vault")
	if raw, err := os.ReadFile(copyFile); err != nil {
		t.Errorf("the node keeps no vault copy of the snapshot: %v", err)
	} else if strings.Contains(string(raw), secret) {
		t.Errorf("the snapshot's vault copy %s holds the secret in clear", copyFile)
	}

	// The source goes, and its vault with it.
	if err := c.Kill(ctx, src.ID); err != nil {
		t.Fatalf("deleting the source: %v", err)
	}
	n.Wait(t, "the source's pod and vault to go", 2*time.Minute, func() (bool, error) {
		_, err := n.Client.CoreV1().Pods("airlock-sandboxes").Get(ctx, kube.PodName(src.ID), metav1.GetOptions{})
		_, statErr := os.Stat(filepath.Join(vaultDir, src.ID+".vault"))
		return apierrors.IsNotFound(err) && os.IsNotExist(statErr), nil
	})

	// The restore: the snapshot's bindings re-bound before its entrypoint runs.
	var restored struct {
		ID string `json:"id"`
	}
	if code := apiCall(ctx, t, a, http.MethodPost, "/sandboxes", map[string]any{
		"snapshotId": id, "timeout": 600, "resourceLimits": res, "entrypoint": []string{"tail", "-f", "/dev/null"},
	}, &restored); code != http.StatusAccepted {
		t.Fatalf("restore: HTTP %d, want 202", code)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), restored.ID) })
	rrun := waitExecd(ctx, t, c, restored.ID)
	rv, err := c.Vault(ctx, restored.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := rv.Get(ctx)
	if err != nil {
		t.Fatalf("the restored sandbox's vault through the egress API: %v", err)
	}
	b, _ := json.Marshal(st)
	if strings.Contains(string(b), secret) {
		t.Errorf("the restored vault's state shows the secret: %s", b)
	}
	if len(st.Bindings) != 1 || st.Bindings[0].Name != "api" {
		t.Errorf("the restored vault: %s, want the binding api", b)
	}
	got := rrun(fmt.Sprintf(`curl -s --max-time 10 --cacert "$SSL_CERT_FILE" https://%s/ 2>&1; echo " rc=$?"`, name))
	seen := authorizations()
	if !strings.HasPrefix(got, "vault-ok") {
		t.Errorf("https://%s/ from the restored sandbox: %q, want the server's vault-ok", name, got)
	}
	if len(seen) != 1 || seen[0] != "Bearer "+secret {
		t.Errorf("the server got Authorization %q, want one request with the injected bearer credential", seen)
	} else {
		t.Logf("vault across the snapshot: https://%s/ from the restored sandbox: %q; the server got the injected secret", name, got)
	}

	// The snapshot's delete takes the node's copy; the restore keeps its own vault.
	if code := apiCall(ctx, t, a, http.MethodDelete, "/snapshots/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE snapshot: HTTP %d, want 204", code)
	}
	if _, err := os.Stat(copyFile); !os.IsNotExist(err) {
		t.Errorf("the snapshot's vault copy outlives the snapshot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(vaultDir, restored.ID+".vault")); err != nil {
		t.Errorf("the restored sandbox's vault after the snapshot's delete: %v", err)
	}
}
