package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/principal"
)

// TestControlRecords drives every mutating route through a real lifecycle server on
// Docker, with a real audit writer and the OCSF export: each call leaves one record of
// source control in the chain with the principal, the request id, the target, the
// status and the outcome; refusals (401, 403, a user's 404 on another's sandbox) are
// recorded as deny; no API key and no vault value is anywhere in the audit directory.
func TestControlRecords(t *testing.T) {
	auditDir := t.TempDir()
	ex, err := ocsf.New(ocsf.Config{ChainDir: auditDir, Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.New(audit.Config{Dir: auditDir, Sink: ex, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	libDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(libDir, "web.yaml"), []byte("defaultAction: deny\negress:\n  - action: allow\n    target: example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := library.Open(library.Config{Dir: libDir})
	if err != nil {
		t.Fatal(err)
	}
	// A signed endpoint as the gateway makes one (the signature is the gateway's
	// business; lifecycle records the minting).
	endpoint := func(er lifecycle.EndpointRequest) (string, error) {
		u := fmt.Sprintf("gw.example/%s/%d", er.ID, er.Port)
		if er.Expires != nil {
			u += "?expires=" + strconv.FormatInt(er.Expires.Unix(), 10) + "&sig=signed-url-SECRET"
		}
		return u, nil
	}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: w, AuditDir: auditDir, CredentialVault: store, Library: lib, Endpoint: endpoint})
	admin := newClient(t, h)

	// Key management.
	ua := admin.newKey("agent a", principal.User)
	ub := admin.newKey("agent b", principal.User)
	aud := admin.newKey("compliance", principal.Auditor)
	var rotated principal.Created
	if err := json.Unmarshal(admin.want("POST", "/v1/keys/"+ub.ID+"/rotate", nil, http.StatusOK, ""), &rotated); err != nil {
		t.Fatal(err)
	}
	userA, userB, auditor := admin.as(ua.Key), admin.as(rotated.Key), admin.as(aud.Key)

	// Sandbox lifecycle as user A.
	req := baseReq(h.Image, nil)
	req["credentialProxy"] = map[string]any{"enabled": true}
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "api.example.com"}}}
	sb := userA.create(req)
	userA.waitState(sb.ID, opensandbox.Running)
	X := "/v1/sandboxes/" + sb.ID
	userA.want("POST", X+"/renew-expiration", `{"expiresAt":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`, http.StatusOK, "")
	userA.want("PATCH", X+"/metadata", `{"k":"v"}`, http.StatusOK, "")
	userA.want("PUT", X+"/policy", `{"defaultAction":"deny","egress":[{"action":"allow","target":"api.example.com"},{"action":"allow","target":"example.org"}]}`, http.StatusOK, "")
	userA.want("PATCH", X+"/policy", `[{"action":"allow","target":"pypi.org"}]`, http.StatusOK, "")
	userA.want("PATCH", X+"/proxy/18080/policy", `[{"action":"allow","target":"*.npmjs.org"}]`, http.StatusOK, "")
	const secret, secret2 = "control-vault-SECRET-1", "control-vault-SECRET-2"
	userA.want("POST", X+"/proxy/18080/credential-vault", map[string]any{
		"credentials": []any{map[string]any{"name": "key", "source": map[string]any{"type": "inline", "value": secret}}},
		"bindings": []any{map[string]any{"name": "api", "match": map[string]any{"hosts": []string{"api.example.com"}},
			"auth": map[string]any{"type": "bearer", "credential": "key"}}},
	}, http.StatusCreated, "")
	userA.want("PATCH", X+"/proxy/18080/credential-vault", `{"expectedRevision":1,"credentials":{"add":[{"name":"k2","source":{"type":"inline","value":"`+secret2+`"}}]}}`, http.StatusOK, "")
	userA.want("DELETE", X+"/proxy/18080/credential-vault", nil, http.StatusNoContent, "")
	expires := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	userA.want("GET", X+"/endpoints/44772?expires="+expires, nil, http.StatusOK, "")
	userA.want("GET", X+"/endpoints/44772", nil, http.StatusOK, "") // not a mint: no record
	userA.want("POST", X+"/signed-urls/revoke", nil, http.StatusOK, "")
	userA.want("POST", X+"/pause", nil, http.StatusAccepted, "")
	userA.waitState(sb.ID, opensandbox.Paused)
	userA.want("POST", X+"/resume", nil, http.StatusAccepted, "")
	userA.waitState(sb.ID, opensandbox.Running)
	admin.want("PUT", X+"/policy?name=web", nil, http.StatusOK, "")
	var sn lifecycle.Snapshot
	if err := json.Unmarshal(admin.want("POST", X+"/snapshots", "{}", http.StatusAccepted, ""), &sn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", "airlock/snapshot:"+strings.ToLower(sn.ID)).Run() })
	admin.waitSnapshot(sn.ID)
	admin.want("DELETE", "/v1/snapshots/"+sn.ID, nil, http.StatusNoContent, "")

	// Refusals: no key, a role that may not, a user reaching another's sandbox.
	admin.as("ak_wrong").want("POST", "/v1/sandboxes", baseReq(h.Image, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	auditor.want("DELETE", X, nil, http.StatusForbidden, "FORBIDDEN")
	userB.want("GET", "/v1/keys", nil, http.StatusForbidden, "FORBIDDEN")
	userB.want("DELETE", X, nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	admin.want("DELETE", "/v1/keys/"+ua.ID, nil, http.StatusNoContent, "")
	userA.want("GET", X, nil, http.StatusUnauthorized, "UNAUTHORIZED") // revoked
	admin.want("DELETE", X, nil, http.StatusNoContent, "")
	// A failed change is recorded as a failure.
	admin.want("POST", "/v1/sandboxes/nosuch/pause", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	if err := audit.Scan(auditDir, audit.Filter{}, func(r audit.Record) error {
		if r.Source == audit.SourceControl {
			recs = append(recs, r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	type want struct {
		op, principal, sandbox, target, action, outcome string
		status                                          int
	}
	adm := principal.ConfiguredAdminID
	wants := []want{
		{"key.create", adm, "", ua.ID, "allow", "success", 201},
		{"key.create", adm, "", ub.ID, "allow", "success", 201},
		{"key.create", adm, "", aud.ID, "allow", "success", 201},
		{"key.rotate", adm, "", ub.ID, "allow", "success", 200},
		{"sandbox.create", ua.ID, sb.ID, "", "allow", "success", 202},
		{"sandbox.renew", ua.ID, sb.ID, "", "allow", "success", 200},
		{"sandbox.metadata", ua.ID, sb.ID, "", "allow", "success", 200},
		{"policy.put", ua.ID, sb.ID, "", "allow", "success", 200},
		{"policy.patch", ua.ID, sb.ID, "", "allow", "success", 200},
		{"egress.policy.patch", ua.ID, sb.ID, "", "allow", "success", 200},
		{"vault.create", ua.ID, sb.ID, "", "allow", "success", 201},
		{"vault.patch", ua.ID, sb.ID, "", "allow", "success", 200},
		{"vault.delete", ua.ID, sb.ID, "", "allow", "success", 204},
		{"signed_url.mint", ua.ID, sb.ID, "", "allow", "success", 200},
		{"signed_url.revoke", ua.ID, sb.ID, "", "allow", "success", 200},
		{"sandbox.pause", ua.ID, sb.ID, "", "allow", "success", 202},
		{"sandbox.resume", ua.ID, sb.ID, "", "allow", "success", 202},
		{"policy.put", adm, sb.ID, "web", "allow", "success", 200},
		{"snapshot.create", adm, sb.ID, sn.ID, "allow", "success", 202},
		{"snapshot.delete", adm, "", sn.ID, "allow", "success", 204},
		{"sandbox.create", "", "", "", "deny", "failure", 401},
		{"sandbox.delete", aud.ID, sb.ID, "", "deny", "failure", 403},
		{"api.read", ub.ID, "", "", "deny", "failure", 403},
		{"sandbox.delete", ub.ID, sb.ID, "", "deny", "failure", 404},
		{"key.revoke", adm, "", ua.ID, "allow", "success", 204},
		{"api.read", "", sb.ID, "", "deny", "failure", 401},
		{"sandbox.delete", adm, sb.ID, "", "allow", "success", 204},
		{"sandbox.pause", adm, "nosuch", "", "allow", "failure", 404},
	}
	if len(recs) != len(wants) {
		for _, r := range recs {
			t.Logf("record: %s %v %s", r.Action, r.Extra, r.SandboxID)
		}
		t.Fatalf("%d control records, want %d", len(recs), len(wants))
	}
	rids := map[string]bool{}
	for i, wt := range wants {
		r := recs[i]
		x := r.Extra
		got := want{fmt.Sprint(x["op"]), str(x["principal"]), r.SandboxID, str(x["target"]), r.Action, fmt.Sprint(x["outcome"]), int(num(x["status"]))}
		if got != wt {
			t.Errorf("record %d: %+v, want %+v (%v)", i, got, wt, x)
		}
		rid := str(x["request_id"])
		if rid == "" || rids[rid] {
			t.Errorf("record %d: request id %q missing or reused", i, rid)
		}
		rids[rid] = true
		if r.Src == "" || str(x["path"]) == "" || str(x["method"]) == "" {
			t.Errorf("record %d lacks the client, path or method: %+v", i, r)
		}
	}

	// Secrets never reach the audit directory (chain, checkpoints, OCSF export).
	secrets := []string{"signed-url-SECRET", testKey, ua.Key, ub.Key, rotated.Key, aud.Key, secret, secret2, strings.TrimPrefix(ua.Key, "ak_")}
	if err := filepath.Walk(auditDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("%s holds a secret (%.8s…)", p, s)
			}
		}
		if strings.HasSuffix(p, ".jsonl") && strings.Contains(p, ocsf.DirName) && !strings.Contains(string(b), `"api":{"operation":"vault.create"`) {
			t.Errorf("%s: no API Activity event of vault.create", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
