package egressd

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/airlockdev/airlock/egressd/ctrsnap"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// snapshotTimeout bounds one commit on the node (the layer is computed and unpacked).
const snapshotTimeout = 14 * time.Minute

// SnapshotHandler serves the snapshot node API (watch.SnapshotPath) with ctr, the
// node's containerd, to callers that send apiKey in opensandbox.HeaderAPIKey (401
// otherwise; lifecycle replicas hold the same key):
//
//   - POST <id>: ctr.Commit of the body's watch.SnapshotCommit, 200 with
//     watch.SnapshotCommitted; 404 when this node does not run sandbox id, or the
//     container is not the one of the pod the body names; 400 for a reference outside
//     watch.SnapshotRefPrefix; 500 when containerd fails (its message).
//   - POST remove: ctr.Remove of the body's watch.SnapshotRemove (204), and the
//     snapshot's sealed vault copy (watch.VaultCopy) with it when the daemon's vault
//     holds one; 400 for a reference outside watch.SnapshotRefPrefix.
//
// `airlock egressd --containerd-socket` serves it on --metrics-listen.
func (d *Daemon) SnapshotHandler(ctr *ctrsnap.Client, apiKey string) http.Handler {
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc { return requireAPIKey(apiKey, h) }
	bad := func(w http.ResponseWriter, msg string) {
		opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST", Message: msg})
	}
	mux.HandleFunc("POST "+watch.SnapshotPath+"remove", auth(func(w http.ResponseWriter, r *http.Request) {
		var req watch.SnapshotRemove
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			bad(w, "body: "+err.Error())
			return
		}
		if !strings.HasPrefix(req.Ref, watch.SnapshotRefPrefix) {
			bad(w, "not a snapshot image: "+req.Ref)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		if err := ctr.Remove(ctx, req.Ref); err != nil {
			d.log.Error("removing a snapshot image failed", "ref", req.Ref, "err", err)
			opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL", Message: err.Error()})
			return
		}
		d.log.Info("snapshot image removed", "ref", req.Ref)
		d.forgetSnapshotVault(req.Ref)
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST "+watch.SnapshotPath+"{id}", auth(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		d.mu.RLock()
		known := d.byID[id] != nil
		d.mu.RUnlock()
		if !known {
			opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "this node does not run sandbox " + id})
			return
		}
		var req watch.SnapshotCommit
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			bad(w, "body: "+err.Error())
			return
		}
		if !strings.HasPrefix(req.Ref, watch.SnapshotRefPrefix) {
			bad(w, "not a snapshot image: "+req.Ref)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), snapshotTimeout)
		defer cancel()
		start := time.Now()
		res, err := ctr.Commit(ctx, ctrsnap.Request{ContainerID: req.ContainerID, PodName: req.Pod, PodNamespace: req.Namespace,
			ContainerName: req.Container, Ref: req.Ref, SnapshotID: req.SnapshotID, DropEnv: req.DropEnv})
		if errors.Is(err, ctrsnap.ErrNotSandbox) {
			opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: err.Error()})
			return
		}
		if err != nil {
			d.log.Error("committing a sandbox's container failed", "sandbox_id", id, "err", err)
			opensandbox.WriteError(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: "INTERNAL", Message: err.Error()})
			return
		}
		d.log.Info("sandbox committed", "sandbox_id", id, "snapshot_id", req.SnapshotID, "ref", res.Ref, "bytes", res.Bytes,
			"commit_ms", time.Since(start).Milliseconds())
		opensandbox.WriteJSON(w, http.StatusOK, watch.SnapshotCommitted{Ref: res.Ref, Digest: res.Digest, Bytes: res.Bytes})
	}))
	return mux
}

// forgetSnapshotVault drops the Credential Vault copy of the snapshot whose image ref
// (watch.SnapshotRefPrefix+"<node>:<snapshot id>") was removed, when the daemon's vault
// keeps copies (vault.Store); failures are logged (the image is gone).
func (d *Daemon) forgetSnapshotVault(ref string) {
	del, ok := d.cfg.Vault.(interface{ Delete(id string) error })
	if !ok {
		return
	}
	_, id, _ := strings.Cut(strings.TrimPrefix(ref, watch.SnapshotRefPrefix), ":")
	if !watch.IsSnapshotID(id) {
		return
	}
	if err := del.Delete(id); err != nil {
		d.log.Error("deleting a snapshot's credential vault copy failed", "snapshot_id", id, "err", err)
	}
}
