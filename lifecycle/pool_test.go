package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

var poolLimits = map[string]string{"cpu": "500m", "memory": "256Mi"}

// waitPool waits until every pool has size ready members (at most 2 min).
func waitPool(t *testing.T, h *lctest.Harness, size int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ps := h.Server.Pools()
		if len(ps) > 0 && ps[0].Ready == size && ps[0].Warming == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run runs a shell command in the sandbox through the server proxy and returns its
// stdout.
func (c *client) run(id, command string) string {
	c.t.Helper()
	resp, b := c.do("POST", "/sandboxes/"+id+"/proxy/44772/command", map[string]any{"command": command})
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("command %q in %s: %d %s", command, id, resp.StatusCode, b)
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		var ev struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "stdout" {
			out.WriteString(ev.Text)
		}
	}
	return strings.TrimSpace(out.String())
}

// TestWarmPool: members are created ahead and stay invisible; a matching create claims
// one and answers Running with the request's env, entrypoint, metadata and image name
// (an alias); 20 creates racing for 5 members never share a container and the misses
// are served cold; the pool refills; a restart adopts the members without leaking; a
// create that does not match is served cold; deletes leave nothing.
func TestWarmPool(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	const size = 5
	opts := lctest.Options{
		APIKey:         testKey,
		KeepContainers: true,
		ImageAliases:   map[string]string{"example.test/pooled:latest": img},
		Pools:          []lifecycle.PoolSpec{{Name: "default", Image: img, Size: size, ResourceLimits: poolLimits}},
	}
	h := lctest.New(t, opts)
	t.Cleanup(func() { lctest.RemoveAll(t, h.Runtime) })
	c := newClient(t, h)
	waitPool(t, h, size)
	if n := countContainers(t, h); n != size {
		t.Fatalf("%d containers with a full pool of %d", n, size)
	}
	var list lifecycle.ListResponse
	if err := json.Unmarshal(c.want("GET", "/v1/sandboxes", nil, http.StatusOK, ""), &list); err != nil || list.Pagination.TotalItems != 0 {
		t.Fatalf("pool members are listed: %+v %v", list, err)
	}

	// One claim: Running at once, the request's settings in force.
	req := baseReq("example.test/pooled:latest", map[string]string{"team": "pool"})
	req["resourceLimits"] = poolLimits
	req["env"] = map[string]string{"CLAIM_ENV": "from-request"}
	req["entrypoint"] = []string{"sh", "-c", "echo entry:$CLAIM_ENV > /tmp/entry; exec tail -f /dev/null"}
	t0 := time.Now()
	sb := c.create(req)
	claimMs := time.Since(t0).Milliseconds()
	if sb.Status.State != opensandbox.Running {
		t.Fatalf("claimed sandbox answered %s, want Running", sb.Status.State)
	}
	t.Logf("claim answered in %d ms", claimMs)
	// The Running state is stored after the answer, at once.
	stored := ""
	for range 100 {
		docs, err := h.Store.Sandboxes()
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Status struct {
				State string `json:"state"`
			} `json:"status"`
		}
		if json.Unmarshal(docs[sb.ID], &doc) == nil {
			if stored = doc.Status.State; stored == string(opensandbox.Running) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if stored != string(opensandbox.Running) {
		t.Fatalf("the claimed sandbox is stored %q, want Running", stored)
	}
	got := c.get(sb.ID)
	if got.Image == nil || got.Image.URI != "example.test/pooled:latest" || got.Metadata["team"] != "pool" ||
		strings.Join(got.Entrypoint, " ") != strings.Join(req["entrypoint"].([]string), " ") {
		t.Fatalf("claimed sandbox reports %+v", got)
	}
	if out := c.run(sb.ID, "echo cmd:$CLAIM_ENV"); out != "cmd:from-request" {
		t.Fatalf("command env: %q", out)
	}
	var entry string
	for range 100 {
		if entry = c.run(sb.ID, "cat /tmp/entry 2>/dev/null"); entry != "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if entry != "entry:from-request" {
		t.Fatalf("the entrypoint did not run with the request's env: %q", entry)
	}

	// A create that matches no pool (other limits) is served cold, through the alias too.
	cold := baseReq("example.test/pooled:latest", nil)
	cold["resourceLimits"] = map[string]string{"cpu": "250m", "memory": "128Mi"}
	csb := c.create(cold)
	if csb.Status.State != opensandbox.Pending {
		t.Fatalf("unmatched create answered %s, want Pending (cold)", csb.Status.State)
	}
	if got := c.waitState(csb.ID, opensandbox.Running); got.Image == nil || got.Image.URI != "example.test/pooled:latest" {
		t.Fatalf("cold create through an alias reports %+v", got.Image)
	}
	waitPool(t, h, size)

	// 20 creates race for the 5 members.
	var (
		mu  sync.Mutex
		ids []string
		wg  sync.WaitGroup
	)
	for i := range 20 {
		wg.Go(func() {
			r := baseReq(img, map[string]string{"n": fmt.Sprint(i)})
			r["resourceLimits"] = poolLimits
			sb := c.create(r)
			mu.Lock()
			ids = append(ids, sb.ID)
			mu.Unlock()
		})
	}
	wg.Wait()
	cids := map[string]string{}
	for _, id := range append(ids, sb.ID, csb.ID) {
		c.waitState(id, opensandbox.Running)
		if out := c.run(id, "echo ok"); out != "ok" {
			t.Fatalf("sandbox %s: %q", id, out)
		}
		rec, err := h.Runtime.Inspect(t.Context(), containerOf(t, h, id))
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := cids[rec.ContainerID]; dup {
			t.Fatalf("sandboxes %s and %s share container %s", id, other, rec.ContainerID)
		}
		cids[rec.ContainerID] = id
	}
	waitPool(t, h, size)
	if n := countContainers(t, h); n != 22+size {
		t.Fatalf("%d containers, want 22 sandboxes + %d members", n, size)
	}

	// Restart on the same store: the members are adopted, none leaks, none doubles.
	h.Stop()
	opts.StateDir = h.StateDir
	h = lctest.New(t, opts)
	c = newClient(t, h)
	waitPool(t, h, size)
	if n := countContainers(t, h); n != 22+size {
		t.Fatalf("after restart: %d containers, want 22 + %d", n, size)
	}
	c.get(sb.ID)

	// Delete everything; stopping the server with an empty registry leaves the members only.
	for _, id := range append(ids, sb.ID, csb.ID) {
		c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent, "")
	}
	if n := countContainers(t, h); n != size {
		t.Fatalf("after deleting every sandbox: %d containers, want the %d members", n, size)
	}
}

// containerOf finds the container of sandbox id by its label.
func containerOf(t *testing.T, h *lctest.Harness, id string) string {
	t.Helper()
	insts, err := h.Runtime.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.SandboxID == id {
			return in.ContainerID
		}
	}
	t.Fatalf("no container for sandbox %s", id)
	return ""
}

// storedDoc reads sandbox id's stored record as a generic document (nil: not stored).
func storedDoc(t *testing.T, h *lctest.Harness, id string) map[string]any {
	t.Helper()
	docs, err := h.Store.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	b, ok := docs[id]
	if !ok {
		return nil
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestWarmPoolInterruptedClaim: a claim stores the request's policy and Running in one
// write, marked claiming, and answers without a second write; a leader that starts on
// that store asks each marked sandbox's execd whether the claim released it: the one
// released keeps running and its mark is cleared; one still held (its claim never
// answered: here a member's record rewritten as claimed, as a claimer killed between
// its write and the release leaves it) is removed with its container.
func TestWarmPoolInterruptedClaim(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	opts := lctest.Options{
		APIKey:         testKey,
		KeepContainers: true,
		Pools:          []lifecycle.PoolSpec{{Name: "default", Image: img, Size: 2, ResourceLimits: poolLimits}},
	}
	h := lctest.New(t, opts)
	t.Cleanup(func() { lctest.RemoveAll(t, h.Runtime) })
	c := newClient(t, h)
	waitPool(t, h, 2)

	req := baseReq(img, nil)
	req["resourceLimits"] = poolLimits
	sb := c.create(req)
	if sb.Status.State != opensandbox.Running {
		t.Fatalf("claim answered %s, want Running", sb.Status.State)
	}
	doc := storedDoc(t, h, sb.ID)
	if st, _ := doc["status"].(map[string]any); st["state"] != string(opensandbox.Running) || doc["claiming"] != true {
		t.Fatalf("after the claim's answer the store holds state %v claiming %v, want Running and true (one write)", st["state"], doc["claiming"])
	}
	if out := c.run(sb.ID, "echo ok"); out != "ok" {
		t.Fatalf("claimed sandbox: %q", out)
	}

	// A member's record rewritten as a claim interrupted before its release.
	var held string
	docs, err := h.Store.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	for id, b := range docs {
		var m map[string]any
		if json.Unmarshal(b, &m) == nil && m["pool"] == "default" {
			held = id
			delete(m, "pool")
			m["claiming"] = true
			m["status"] = map[string]any{"state": string(opensandbox.Running), "reason": "ready", "lastTransitionAt": time.Now().UTC()}
			nb, _ := json.Marshal(m)
			if err := h.Store.PutSandbox(id, nb); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if held == "" {
		t.Fatal("no pool member in the store")
	}
	heldCID := containerOf(t, h, held)

	h.Stop()
	opts.StateDir = h.StateDir
	h = lctest.New(t, opts)
	c = newClient(t, h)
	deadline := time.Now().Add(time.Minute)
	for {
		d := storedDoc(t, h, sb.ID)
		_, gone := h.Runtime.Inspect(t.Context(), heldCID)
		if d != nil && d["claiming"] == nil && storedDoc(t, h, held) == nil && gone != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: released claim stored %v; held claim stored %v, container err %v",
				d, storedDoc(t, h, held) != nil, gone)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := c.get(sb.ID); got.Status.State != opensandbox.Running {
		t.Fatalf("the released claim is %s after restart", got.Status.State)
	}
	if out := c.run(sb.ID, "echo ok"); out != "ok" {
		t.Fatalf("released claim after restart: %q", out)
	}
	c.want("GET", "/v1/sandboxes/"+held, nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	waitPool(t, h, 2)
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}
