package lifecycle_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// as returns a client of the same server with another key.
func (c *client) as(key string) *client { return &client{t: c.t, base: c.base, key: key} }

// newKey creates a principal through the API (as c) and returns its answer.
func (c *client) newKey(name string, role principal.Role) principal.Created {
	c.t.Helper()
	var k principal.Created
	b := c.want("POST", "/v1/keys", principal.CreateRequest{Name: name, Role: role}, http.StatusCreated, "")
	if err := json.Unmarshal(b, &k); err != nil || !strings.HasPrefix(k.Key, "ak_") || k.ID == "" || k.Role != role {
		c.t.Fatalf("POST /v1/keys: %v %s", err, b)
	}
	return k
}

// TestPrincipals: every role against every route class (allowed, 403 when the role may
// not, 404 for a user reaching another principal's sandbox, also through the server
// proxy and the list), keys hashed in the store, revocation and rotation effective at
// once, the creator recorded on the sandbox, policy-change records naming the principal.
func TestPrincipals(t *testing.T) {
	sink := &memAudit{}
	h := lctest.New(t, lctest.Options{APIKey: testKey, Audit: sink})
	admin := newClient(t, h)

	// Only an admin manages keys; the configured key is the admin principal.
	var self principal.Principal
	_ = json.Unmarshal(admin.want("GET", "/v1/keys/self", nil, http.StatusOK, ""), &self)
	if self.ID != principal.ConfiguredAdminID || self.Role != principal.Admin {
		t.Fatalf("the configured key is %+v, want the admin principal", self)
	}
	op := admin.newKey("ops team", principal.Operator)
	aud := admin.newKey("compliance", principal.Auditor)
	ua := admin.newKey("agent a", principal.User)
	ub := admin.newKey("agent b", principal.User)
	operator, auditor, userA, userB := admin.as(op.Key), admin.as(aud.Key), admin.as(ua.Key), admin.as(ub.Key)
	for _, c := range []struct {
		c    *client
		role principal.Role
	}{{operator, principal.Operator}, {auditor, principal.Auditor}, {userA, principal.User}} {
		var p principal.Principal
		_ = json.Unmarshal(c.c.want("GET", "/v1/keys/self", nil, http.StatusOK, ""), &p)
		if p.Role != c.role {
			t.Errorf("GET /v1/keys/self as %s: %+v", c.role, p)
		}
	}

	// Keys are stored hashed: no key in the database file, its SHA-256 is.
	db, err := os.ReadFile(filepath.Join(h.StateDir, "lifecycle.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []principal.Created{op, aud, ua, ub} {
		if bytes.Contains(db, []byte(k.Key)) || bytes.Contains(db, []byte(strings.TrimPrefix(k.Key, "ak_"))) {
			t.Fatalf("the store file holds the raw key of %s", k.ID)
		}
		if !bytes.Contains(db, []byte(principal.Hash(k.Key))) {
			t.Fatalf("the store file lacks the hash of %s's key", k.ID)
		}
	}

	// Sandboxes record their creator.
	sbAdmin := admin.create(baseReq(h.Image, map[string]string{"who": "admin"}))
	sbA := userA.create(baseReq(h.Image, map[string]string{"who": "a"}))
	if got := sbA.Airlock; got == nil || got.CreatedBy != ua.ID || len(sbA.Metadata) != 1 {
		t.Fatalf("create answer of user A: airlock %+v, metadata %v, want createdBy %q and the metadata as created", got, sbA.Metadata, ua.ID)
	}
	admin.waitState(sbAdmin.ID, opensandbox.Running)
	userA.waitState(sbA.ID, opensandbox.Running)
	if got := admin.get(sbA.ID).Airlock; got == nil || got.CreatedBy != ua.ID {
		t.Fatalf("GET as admin: airlock %+v, want createdBy %q", got, ua.ID)
	}

	// Lists: a user sees its own sandboxes only.
	list := func(c *client, query string) []string {
		var l lifecycle.ListResponse
		_ = json.Unmarshal(c.want("GET", "/v1/sandboxes"+query, nil, http.StatusOK, ""), &l)
		var ids []string
		for _, sb := range l.Items {
			ids = append(ids, sb.ID)
		}
		return ids
	}
	if ids := list(userA, ""); len(ids) != 1 || ids[0] != sbA.ID {
		t.Errorf("user A lists %v, want only %s", ids, sbA.ID)
	}
	if ids := list(userB, ""); len(ids) != 0 {
		t.Errorf("user B lists %v, want nothing", ids)
	}
	if ids := list(auditor, ""); len(ids) != 2 {
		t.Errorf("the auditor lists %v, want both sandboxes", ids)
	}

	X := sbAdmin.ID
	renew := `{"expiresAt":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`
	policy := `{"defaultAction":"deny","egress":[{"action":"allow","target":"example.com"}]}`
	type cell struct {
		method, path, body string
		// want per role: admin, operator, auditor, user A (not the owner unless noted)
		want [4]int
	}
	cells := []cell{
		{"GET", "/v1/sandboxes/" + X, "", [4]int{200, 200, 200, 404}},
		{"GET", "/v1/sandboxes/" + X + "/policy", "", [4]int{200, 200, 200, 404}},
		{"GET", "/v1/sandboxes/" + X + "/audit", "", [4]int{501, 501, 501, 404}},
		{"GET", "/v1/sandboxes/" + X + "/diagnostics/events?scope=lifecycle", "", [4]int{200, 200, 200, 404}},
		{"POST", "/v1/sandboxes/" + X + "/renew-expiration", renew, [4]int{200, 200, 403, 404}},
		{"PATCH", "/v1/sandboxes/" + X + "/metadata", `{"k":"v"}`, [4]int{200, 200, 403, 404}},
		{"PUT", "/v1/sandboxes/" + X + "/policy", policy, [4]int{200, 200, 403, 404}},
		{"POST", "/v1/sandboxes/" + X + "/signed-urls/revoke", "", [4]int{200, 200, 403, 404}},
		{"GET", "/v1/sandboxes/" + X + "/endpoints/44772", "", [4]int{200, 200, 403, 404}},
		{"GET", "/v1/sandboxes/" + X + "/proxy/44772/ping", "", [4]int{200, 200, 403, 404}},
		{"GET", "/v1/sandboxes/" + X + "/proxy/18080/policy", "", [4]int{200, 200, 403, 404}},
		{"POST", "/v1/sandboxes/" + X + "/pause", "", [4]int{202, 0, 403, 404}},
		{"POST", "/v1/sandboxes/" + X + "/resume", "", [4]int{202, 0, 403, 404}},
		{"GET", "/v1/policies", "", [4]int{200, 200, 200, 403}},
		{"GET", "/v1/keys", "", [4]int{200, 403, 403, 403}},
		{"POST", "/v1/keys", `{"name":"x","role":"user"}`, [4]int{201, 403, 403, 403}},
		{"POST", "/v1/keys/" + ub.ID + "/rotate", "", [4]int{0, 403, 403, 403}},
		{"DELETE", "/v1/keys/" + ub.ID, "", [4]int{0, 403, 403, 403}},
		{"GET", "/v1/snapshots", "", [4]int{200, 200, 200, 200}},
		{"POST", "/v1/sandboxes/" + X + "/snapshots", "", [4]int{0, 0, 403, 404}},
		// The user's own sandbox: everything a user may do.
		{"GET", "/v1/sandboxes/" + sbA.ID, "", [4]int{200, 200, 200, 200}},
		{"PATCH", "/v1/sandboxes/" + sbA.ID + "/metadata", `{"k":"v"}`, [4]int{200, 200, 403, 200}},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/endpoints/44772", "", [4]int{200, 200, 403, 200}},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/proxy/44772/ping", "", [4]int{200, 200, 403, 200}},
		{"PUT", "/v1/sandboxes/" + sbA.ID + "/policy", policy, [4]int{200, 200, 403, 200}},
	}
	roles := []*client{admin, operator, auditor, userA}
	for _, cl := range cells {
		for i, c := range roles {
			if cl.want[i] == 0 {
				continue
			}
			var body any
			if cl.body != "" {
				body = cl.body
			}
			resp, b := c.do(cl.method, cl.path, body)
			if resp.StatusCode != cl.want[i] {
				t.Errorf("%s %s as %s: %d, want %d: %s", cl.method, cl.path, principal.Roles[i], resp.StatusCode, cl.want[i], b)
			}
		}
	}
	// User B reaches none of user A's sandbox, whatever the route.
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + sbA.ID, ""},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/endpoints/44772", ""},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/proxy/44772/ping", ""},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/proxy/18080/policy", ""},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/diagnostics/logs?scope=container", ""},
		{"POST", "/v1/sandboxes/" + sbA.ID + "/pause", ""},
		{"DELETE", "/v1/sandboxes/" + sbA.ID, ""},
	} {
		var body any
		if r.body != "" {
			body = r.body
		}
		if resp, b := userB.do(r.method, r.path, body); resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "SANDBOX_NOT_FOUND") {
			t.Errorf("%s %s as user B: %d %s, want 404 SANDBOX_NOT_FOUND", r.method, r.path, resp.StatusCode, b)
		}
	}
	// The watch is the data plane's: admin only.
	for _, c := range []*client{operator, auditor, userA} {
		if st := c.status("GET", "/internal/v1/watch", opensandbox.HeaderAPIKey, c.key); st != http.StatusForbidden {
			t.Errorf("the watch as %s: %d, want 403", c.key[:6], st)
		}
	}

	// Policy change records name the principal that made the change.
	found := false
	sink.mu.Lock()
	for _, r := range sink.recs {
		if r.Source == audit.SourcePolicy && r.SandboxID == sbA.ID && r.Extra["principal"] == ua.ID {
			found = true
		}
	}
	sink.mu.Unlock()
	if !found {
		t.Errorf("no policy record of %s names principal %s", sbA.ID, ua.ID)
	}

	// Revocation takes effect at once (well within 1 s); the configured key cannot be
	// revoked through the API.
	admin.want("DELETE", "/v1/keys/"+ub.ID, nil, http.StatusNoContent, "")
	start := time.Now()
	for userB.status("GET", "/v1/sandboxes", opensandbox.HeaderAPIKey, ub.Key) != http.StatusUnauthorized {
		if time.Since(start) > time.Second {
			t.Fatal("a revoked key still works after 1 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	admin.want("DELETE", "/v1/keys/"+principal.ConfiguredAdminID, nil, http.StatusConflict, "INVALID_STATE")
	admin.want("DELETE", "/v1/keys/"+ub.ID, nil, http.StatusNotFound, "KEY_NOT_FOUND")
	admin.want("POST", "/v1/keys", `{"name":"x","role":"root"}`, http.StatusBadRequest, "INVALID_REQUEST")

	// Rotation: the old key stops, the new one works as the same principal.
	var rot principal.Created
	_ = json.Unmarshal(admin.want("POST", "/v1/keys/"+ua.ID+"/rotate", nil, http.StatusOK, ""), &rot)
	if rot.ID != ua.ID || rot.Key == ua.Key || !strings.HasPrefix(rot.Key, "ak_") {
		t.Fatalf("rotate: %+v", rot)
	}
	if st := userA.status("GET", "/v1/sandboxes/"+sbA.ID, opensandbox.HeaderAPIKey, ua.Key); st != http.StatusUnauthorized {
		t.Errorf("the rotated-away key: %d, want 401", st)
	}
	userA = admin.as(rot.Key)
	userA.want("GET", "/v1/sandboxes/"+sbA.ID, nil, http.StatusOK, "")

	var keys struct{ Items []principal.Info }
	_ = json.Unmarshal(admin.want("GET", "/v1/keys", nil, http.StatusOK, ""), &keys)
	if n := len(keys.Items); n != 5 || !keys.Items[0].Configured || strings.Contains(string(must(json.Marshal(keys))), "ak_") {
		t.Errorf("GET /v1/keys: %+v", keys.Items)
	}
	userA.want("DELETE", "/v1/sandboxes/"+sbA.ID, nil, http.StatusNoContent, "")
	admin.want("GET", "/v1/sandboxes", nil, http.StatusOK, "")
	admin.as("").want("GET", "/v1/sandboxes", nil, http.StatusUnauthorized, "UNAUTHORIZED")
	admin.as("ak_wrong").want("GET", "/v1/sandboxes", nil, http.StatusUnauthorized, "UNAUTHORIZED")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
