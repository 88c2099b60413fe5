package cluster

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// maxVaultBody bounds a forwarded vault request or answer (the vault's own limit is
// 1 MiB).
const maxVaultBody = 2 << 20

// nodeVault is lifecycle's Credential Vault on Kubernetes (lifecycle.CredentialVault):
// the vault of a credentialProxy sandbox lives in the egressd of its pod's node (`airlock
// egressd --vault-dir`, watch.VaultPath on the node address), where the L7 proxy
// injects its credentials. A sandbox's pod needs its CA certificate before it has a
// node (the trust init container installs it), so lifecycle makes the CA at create
// (vault.NewCA) and hands it, key included, to the node's egressd once the pod runs
// there, before the entrypoint is released (install, part of the ready gate); the
// key is then dropped here. The egress API's /credential-vault routes are forwarded to
// that egressd, which checks each binding against the policy it enforces for the
// sandbox (policies.CoversBinding, as lifecycle does on one host); values pass
// through, never kept.
//
// A replica that stops between a create and its release loses that CA key: the
// sandbox's node then makes another CA, which the sandbox does not trust, so its
// intercepted connections fail (closed; no secret leaves).
//
// Snapshots (lifecycle.VaultCopier): at capture the source's node copies the sandbox's
// sealed credentials and bindings to a copy keyed by the snapshot id (POST
// watch.VaultPath+"copy"), which stays on that node after the source is deleted; a
// restore runs on the snapshot's node (lifecycle/kube pins it), so install has that
// node copy the snapshot's vault to the new sandbox after its CA, before the
// entrypoint is released. The copy goes with the snapshot: the node's egressd drops it
// when it removes the snapshot's image, and Delete of the snapshot id asks the node
// this replica captured it on.
type nodeVault struct {
	gate   *enforcementGate // the node of a sandbox (pod status.hostIP)
	apiKey string
	http   *http.Client
	log    *slog.Logger

	mu      sync.Mutex
	pending map[string]watch.VaultCA // made at create, not yet on the node
	copies  map[string]string        // restored sandbox id -> snapshot id, not yet copied
	snaps   map[string]string        // snapshot id -> its node's egressd (captured here)
}

func newNodeVault(gate *enforcementGate, apiKey string, log *slog.Logger) *nodeVault {
	return &nodeVault{gate: gate, apiKey: apiKey, log: log, pending: map[string]watch.VaultCA{},
		copies: map[string]string{}, snaps: map[string]string{},
		http: &http.Client{Timeout: 10 * time.Second}}
}

// CA makes sandbox id's interception CA (kept until install hands it to the node).
func (v *nodeVault) CA(id string) (*x509.Certificate, crypto.Signer, []byte, error) {
	v.mu.Lock()
	ca, ok := v.pending[id]
	v.mu.Unlock()
	if !ok {
		der, key, err := vault.NewCA(id)
		if err != nil {
			return nil, nil, nil, err
		}
		ca = watch.VaultCA{Cert: der, Key: key}
		v.mu.Lock()
		v.pending[id] = ca
		v.mu.Unlock()
	}
	cert, err := x509.ParseCertificate(ca.Cert)
	if err != nil {
		return nil, nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, nil, nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, nil, errors.New("cluster: the CA key is not a signer")
	}
	return cert, signer, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert}), nil
}

// install hands sandbox id's CA to its node's egressd, then has the node re-bind the
// vault of the snapshot the sandbox was restored from (CopyVault); true when both are
// done (or there is nothing to do). False while the pod has no node, or the node's
// egressd does not know the sandbox yet (its watch has not delivered it) or fails: the
// ready gate asks again.
func (v *nodeVault) install(id string) bool {
	v.mu.Lock()
	ca, hasCA := v.pending[id]
	snap, hasCopy := v.copies[id]
	v.mu.Unlock()
	if !hasCA && !hasCopy {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	base, ok := v.gate.node(ctx, id)
	if !ok {
		return false
	}
	if hasCA && !v.installCA(ctx, base, id, ca) {
		return false
	}
	if hasCopy {
		if err := v.copyOn(ctx, base, snap, id); err != nil {
			return false
		}
		v.mu.Lock()
		delete(v.copies, id)
		v.mu.Unlock()
	}
	return true
}

// installCA PUTs ca to the egressd at base as sandbox id's CA; true once it has it.
func (v *nodeVault) installCA(ctx context.Context, base, id string, ca watch.VaultCA) bool {
	body, err := json.Marshal(ca)
	if err != nil {
		return false
	}
	resp, err := v.do(ctx, http.MethodPut, base+watch.VaultPath+id+"/ca", "application/json", bytes.NewReader(body))
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		if resp.StatusCode != http.StatusNotFound {
			v.log.Warn("the node's egressd refused the sandbox's CA", "sandbox_id", id, "status", resp.Status)
		}
		return false
	}
	v.mu.Lock()
	delete(v.pending, id)
	v.mu.Unlock()
	return true
}

// ServeAPI forwards rest ("/credential-vault…") of sandbox id to its node's egressd
// and copies the answer back; 503 while the pod has no node. cover is not used: the
// node checks bindings against the policy it enforces (the same policy).
func (v *nodeVault) ServeAPI(w http.ResponseWriter, r *http.Request, id, rest string, _ func(string, uint16) error) {
	base, ok := v.gate.node(r.Context(), id)
	if !ok {
		opensandbox.WriteError(w, http.StatusServiceUnavailable, opensandbox.ErrorBody{Code: "UNAVAILABLE",
			Message: "the sandbox's pod has no node yet: try again once it is Running"})
		return
	}
	url := base + watch.VaultPath + id + rest
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	resp, err := v.do(r.Context(), r.Method, url, r.Header.Get("Content-Type"), http.MaxBytesReader(w, r.Body, maxVaultBody))
	if err != nil {
		v.log.Error("forwarding a credential vault request to the node failed", "sandbox_id", id, "err", err)
		opensandbox.WriteError(w, http.StatusBadGateway, opensandbox.ErrorBody{Code: "BAD_GATEWAY",
			Message: "the sandbox's node did not answer; see lifecycle's log"})
		return
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, maxVaultBody))
}

// CopyVault implements lifecycle.VaultCopier between a sandbox and a snapshot
// (watch.IsSnapshotID): to a snapshot (capture), the sandbox's node copies it now and
// this replica remembers the node for Delete; from a snapshot (restore, to a sandbox
// whose pod has no node yet), install does it once the pod runs there. Errors: the
// sandbox has no node, the node fails or refuses, or neither side is a snapshot.
func (v *nodeVault) CopyVault(from, to string) error {
	switch {
	case watch.IsSnapshotID(from) && !watch.IsSnapshotID(to):
		v.mu.Lock()
		v.copies[to] = from
		v.mu.Unlock()
		return nil
	case watch.IsSnapshotID(to) && !watch.IsSnapshotID(from):
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		base, ok := v.gate.node(ctx, from)
		if !ok {
			return fmt.Errorf("cluster: sandbox %s has no node", from)
		}
		if err := v.copyOn(ctx, base, from, to); err != nil {
			return err
		}
		v.mu.Lock()
		if len(v.snaps) >= maxGateEntries { // forgotten ones are dropped with their image
			clear(v.snaps)
		}
		v.snaps[to] = base
		v.mu.Unlock()
		return nil
	default:
		return fmt.Errorf("cluster: the node vault copies between a sandbox and a snapshot only, not %s to %s", from, to)
	}
}

// copyOn has the egressd at base copy holder from's vault to to (watch.VaultCopy).
func (v *nodeVault) copyOn(ctx context.Context, base, from, to string) error {
	body, err := json.Marshal(watch.VaultCopy{From: from, To: to})
	if err != nil {
		return err
	}
	resp, err := v.do(ctx, http.MethodPost, base+watch.VaultPath+"copy", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cluster: the node's egressd: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		var e opensandbox.ErrorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		if resp.StatusCode != http.StatusNotFound { // 404: the node's watch has not delivered the sandbox yet
			v.log.Warn("the node's egressd refused a vault copy", "from", from, "to", to, "status", resp.Status, "message", e.Message)
		}
		return fmt.Errorf("cluster: the node's egressd answered %s to copying the vault of %s to %s: %s", resp.Status, from, to, e.Message)
	}
	return nil
}

// Delete forgets sandbox id's CA (and pending re-binding) here and asks its node to
// drop the vault (best effort: the node's egressd also drops it when the sandbox
// leaves the watch). For a snapshot id, the node it was captured on through this
// replica drops its copy; another replica's, or one from before a restart, goes with
// the snapshot's image (the node's egressd drops both).
func (v *nodeVault) Delete(id string) error {
	v.mu.Lock()
	delete(v.pending, id)
	delete(v.copies, id)
	snapBase, isSnap := v.snaps[id]
	delete(v.snaps, id)
	v.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	base, ok := snapBase, isSnap
	if watch.IsSnapshotID(id) {
		if !ok {
			return nil
		}
	} else if base, ok = v.gate.node(ctx, id); !ok {
		return nil
	}
	resp, err := v.do(ctx, http.MethodDelete, base+watch.VaultPath+id, "", nil)
	if err != nil {
		return nil // the node is gone or restarting; its egressd forgets on its own
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("the node's egressd answered %s to deleting the vault", resp.Status)
	}
	return nil
}

// do sends one request to a node's egressd with the API key.
func (v *nodeVault) do(ctx context.Context, method, url, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set(opensandbox.HeaderAPIKey, v.apiKey)
	return v.http.Do(req)
}

var _ lifecycle.VaultCopier = (*nodeVault)(nil)
