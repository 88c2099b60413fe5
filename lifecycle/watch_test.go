package lifecycle_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// recorder is a watch.Handler keeping the current set.
type recorder struct {
	mu      sync.Mutex
	cur     map[string]watch.Sandbox
	deleted map[string]bool
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{cur: map[string]watch.Sandbox{}, deleted: map[string]bool{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) Replace(all []watch.Sandbox, _ uint64) {
	r.mu.Lock()
	r.cur = map[string]watch.Sandbox{}
	for _, s := range all {
		r.cur[s.ID] = s
	}
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Upsert(s watch.Sandbox, _ uint64) {
	r.mu.Lock()
	r.cur[s.ID] = s
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Delete(id string, _ uint64) {
	r.mu.Lock()
	delete(r.cur, id)
	r.deleted[id] = true
	r.mu.Unlock()
	r.poke()
}

// await waits (at most 60 s) until cond holds on the recorded set.
func (r *recorder) await(t *testing.T, what string, cond func(map[string]watch.Sandbox, map[string]bool) bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		r.mu.Lock()
		ok := cond(r.cur, r.deleted)
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("watch never showed: %s", what)
		}
	}
}

// TestWatch follows /internal/v1/watch with the watch client: the snapshot, then every
// change of a sandbox with its address, runtime, access, policy and expiry.
func TestWatch(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey})
	c := newClient(t, h)
	anon := &client{t: t, base: h.HTTP.URL}
	anon.want("GET", "/internal/v1/watch", nil, http.StatusUnauthorized, "UNAUTHORIZED")

	// One sandbox exists before the client connects: it arrives in the snapshot.
	first := c.create(baseReq(h.Image, map[string]string{"k": "first"}))

	wc, err := watch.NewClient(watch.ClientConfig{
		URL:    h.HTTP.URL + "/internal/v1/watch",
		Header: http.Header{"Open-Sandbox-Api-Key": {testKey}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = wc.Run(ctx, rec) }()
	t.Cleanup(func() { cancel(); <-done })
	rec.await(t, "snapshot with the first sandbox", func(m map[string]watch.Sandbox, _ map[string]bool) bool {
		_, ok := m[first.ID]
		return ok
	})

	policy := `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}`
	req := baseReq(h.Image, map[string]string{"k": "second"})
	req["secureAccess"] = true
	req["networkPolicy"] = json.RawMessage(policy)
	req["extensions"] = map[string]string{lifecycle.ExtRenewOnAccess: "900"}
	second := c.create(req)
	rec.await(t, "second sandbox Running", func(m map[string]watch.Sandbox, _ map[string]bool) bool {
		return m[second.ID].State == "Running"
	})
	rec.mu.Lock()
	w := rec.cur[second.ID]
	rec.mu.Unlock()
	if !w.Address.IsValid() || w.Runtime.Kind != "docker" || w.Runtime.ContainerID == "" || w.Runtime.Pid == 0 {
		t.Errorf("placement facts: %+v", w)
	}
	if string(w.Policy) != policy || w.PolicyVersion != 1 {
		t.Errorf("policy %s v%d", w.Policy, w.PolicyVersion)
	}
	if w.RenewOnAccess != 900 || w.ExpiresAt == nil || !w.ExpiresAt.Equal(*second.ExpiresAt) {
		t.Errorf("renewOnAccess %d expiresAt %v", w.RenewOnAccess, w.ExpiresAt)
	}
	// The access token the endpoint hands out is the one whose hash the data plane has.
	var ep lifecycle.Endpoint
	_ = json.Unmarshal(c.want("GET", "/v1/sandboxes/"+second.ID+"/endpoints/8080", nil, http.StatusOK, ""), &ep)
	tok := ep.Headers[lifecycle.AccessTokenHeader]
	sum := sha256.Sum256([]byte(tok))
	if tok == "" || w.Access.Mode != watch.Token || w.Access.TokenSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("access %+v, endpoint headers %v", w.Access, ep.Headers)
	}
	// Without secureAccess: public by default, execd and the egress API token, and a
	// token of its own.
	if fw, _ := h.Server.Hub().Get(first.ID); fw.Access.Mode != watch.Public || fw.Access.ModeFor(44772) != watch.Token ||
		fw.Access.ModeFor(18080) != watch.Token || len(fw.Access.TokenSHA256) != 64 || fw.Access.TokenSHA256 == w.Access.TokenSHA256 ||
		len(fw.Policy) != 0 {
		t.Errorf("first sandbox access/policy: %+v", fw)
	}

	// Policy changes through the hook reach the watch with a new version.
	if v, err := h.Server.SetPolicy(second.ID, json.RawMessage(`{"defaultAction":"allow"}`)); err != nil || v != 2 {
		t.Fatalf("SetPolicy: %d %v", v, err)
	}
	rec.await(t, "policy version 2", func(m map[string]watch.Sandbox, _ map[string]bool) bool {
		return m[second.ID].PolicyVersion == 2 && string(m[second.ID].Policy) == `{"defaultAction":"allow"}`
	})
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	c.want("POST", "/v1/sandboxes/"+second.ID+"/renew-expiration", map[string]any{"expiresAt": at}, http.StatusOK, "")
	rec.await(t, "renewed expiry", func(m map[string]watch.Sandbox, _ map[string]bool) bool {
		e := m[second.ID].ExpiresAt
		return e != nil && e.Equal(at)
	})
	// Renew-on-access (the gateway's intent) only moves the deadline forward.
	if got, ok, err := h.Server.RenewOnAccess(second.ID); err != nil || !ok || !got.Equal(at) {
		t.Errorf("RenewOnAccess before the deadline: %s %v %v", got, ok, err)
	}
	if _, ok, _ := h.Server.RenewOnAccess(first.ID); ok {
		t.Errorf("RenewOnAccess renewed a sandbox without the extension")
	}
	c.want("POST", "/v1/sandboxes/"+second.ID+"/renew-expiration", map[string]any{"expiresAt": time.Now().Add(2 * time.Minute)}, http.StatusOK, "")
	got, ok, err := h.Server.RenewOnAccess(second.ID)
	if err != nil || !ok || got.Before(time.Now().Add(14*time.Minute)) {
		t.Errorf("RenewOnAccess: %s %v %v", got, ok, err)
	}
	rec.await(t, "renewed on access", func(m map[string]watch.Sandbox, _ map[string]bool) bool {
		e := m[second.ID].ExpiresAt
		return e != nil && e.Equal(got)
	})
	c.want("POST", "/v1/sandboxes/"+second.ID+"/pause", nil, http.StatusAccepted, "")
	rec.await(t, "Paused", func(m map[string]watch.Sandbox, _ map[string]bool) bool { return m[second.ID].State == "Paused" })
	c.want("DELETE", "/v1/sandboxes/"+second.ID, nil, http.StatusNoContent, "")
	rec.await(t, "DELETED", func(m map[string]watch.Sandbox, d map[string]bool) bool { return d[second.ID] })
	if st := wc.Status(); !st.Synced {
		t.Errorf("client status %+v", st)
	}
}
