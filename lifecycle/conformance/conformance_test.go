package conformance_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// sleeper is a create request for a sandbox that runs until deleted.
func sleeper(extra map[string]any) map[string]any {
	req := map[string]any{
		"image":          map[string]any{"uri": "airlock/sandbox:latest"},
		"entrypoint":     []string{"sleep", "infinity"},
		"timeout":        600,
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"},
	}
	for k, v := range extra {
		req[k] = v
	}
	return req
}

// TestConformance runs the suite on every runtime.
func TestConformance(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			p := tg.start(t)
			t.Run("CreateWithEveryOption", func(t *testing.T) { testCreate(t, p) })
			t.Run("ListFiltersAndPages", func(t *testing.T) { testList(t, p) })
			t.Run("DeleteRemovesEverything", func(t *testing.T) { testDelete(t, p) })
			t.Run("Expiry", func(t *testing.T) { testExpiry(t, p) })
			t.Run("RestartRecoversState", func(t *testing.T) { testRestart(t, p) })
			t.Run("Diagnostics", func(t *testing.T) { testDiagnostics(t, p) })
		})
	}
}

// A create with every option answers Pending, becomes Running, reports what was asked,
// and the runtime made what was asked; execd answers through the server proxy with the
// env in place.
func testCreate(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	before := time.Now()
	id := c.create(sleeper(map[string]any{
		"env":        map[string]string{"CONFORMANCE": "yes", "SECOND": "2"},
		"metadata":   map[string]string{"suite": "conformance", "case": "create"},
		"timeout":    300,
		"extensions": map[string]string{"note": "kept"},
		"networkPolicy": map[string]any{"defaultAction": "deny", "egress": []map[string]any{
			{"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "192.0.2.0/24"}}},
	}))
	t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
	sb := c.waitState(id, opensandbox.Running)
	if sb.Image == nil || sb.Image.URI != "airlock/sandbox:latest" {
		t.Errorf("image %+v", sb.Image)
	}
	if fmt.Sprint(sb.Entrypoint) != "[sleep infinity]" {
		t.Errorf("entrypoint %v (the user's, not execd's)", sb.Entrypoint)
	}
	if sb.Metadata["suite"] != "conformance" || sb.Metadata["case"] != "create" {
		t.Errorf("metadata %v", sb.Metadata)
	}
	if sb.ExpiresAt == nil || sb.ExpiresAt.Sub(before) < 299*time.Second || sb.ExpiresAt.Sub(before) > 310*time.Second {
		t.Errorf("expiresAt %v for a 300 s timeout from %v", sb.ExpiresAt, before)
	}
	v := p.inspect(id)
	if v.Env["CONFORMANCE"] != "yes" || v.Env["SECOND"] != "2" {
		t.Errorf("runtime env %v", v.Env)
	}
	if v.NanoCPUs != 5e8 || v.MemoryBytes != 256<<20 {
		t.Errorf("runtime limits cpu %d nano, memory %d bytes", v.NanoCPUs, v.MemoryBytes)
	}
	if !v.SecondLayer {
		t.Error("the runtime's second network layer is missing")
	}
	if out := c.run(id, "echo $CONFORMANCE-$SECOND"); out != "yes-2" {
		t.Errorf("execd through the server proxy: %q", out)
	}
	// The policy is stored as given.
	var pol map[string]any
	if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+id+"/policy", nil, http.StatusOK), &pol); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(pol); !json.Valid(b) || len(b) < 20 {
		t.Errorf("policy %s", b)
	}
	// Bad input changes nothing.
	st, b := c.do("POST", "/v1/sandboxes", sleeper(map[string]any{"resourceLimits": map[string]string{"cpu": "lots"}}))
	if st != http.StatusBadRequest {
		t.Errorf("bad limits: %d %s", st, b)
	}
}

// List filters by state and metadata and pages, newest first.
func testList(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	run := fmt.Sprint(time.Now().UnixNano())
	var ids []string
	for i := range 3 {
		id := c.create(sleeper(map[string]any{"metadata": map[string]string{"run": run, "i": fmt.Sprint(i)}}))
		t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
		ids = append(ids, id)
	}
	for _, id := range ids {
		c.waitState(id, opensandbox.Running)
	}
	list := func(q string) lifecycle.ListResponse {
		var out lifecycle.ListResponse
		if err := json.Unmarshal(c.want("GET", "/v1/sandboxes?"+q, nil, http.StatusOK), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	md := "metadata=" + url.QueryEscape("run="+run)
	page1 := list(md + "&pageSize=2&page=1")
	if len(page1.Items) != 2 || page1.Pagination.TotalItems != 3 || !page1.Pagination.HasNextPage {
		t.Fatalf("page 1: %+v", page1.Pagination)
	}
	page2 := list(md + "&pageSize=2&page=2")
	if len(page2.Items) != 1 || page2.Pagination.HasNextPage {
		t.Fatalf("page 2: %+v", page2.Pagination)
	}
	if page1.Items[0].ID != ids[2] || page2.Items[0].ID != ids[0] {
		t.Errorf("order: %s %s %s, want newest first %v", page1.Items[0].ID, page1.Items[1].ID, page2.Items[0].ID, ids)
	}
	one := list("metadata=" + url.QueryEscape("run="+run+"&i=1"))
	if len(one.Items) != 1 || one.Items[0].ID != ids[1] {
		t.Errorf("metadata filter: %+v", one.Items)
	}
	if n := list(md + "&state=Paused").Pagination.TotalItems; n != 0 {
		t.Errorf("%d paused sandboxes", n)
	}
	if n := list(md + "&state=Running").Pagination.TotalItems; n != 3 {
		t.Errorf("%d running sandboxes, want 3", n)
	}
}

// Delete answers 204, the sandbox is gone from the API and from the runtime.
func testDelete(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	id := c.create(sleeper(nil))
	c.waitState(id, opensandbox.Running)
	if !p.objects(id) {
		t.Fatal("the runtime has nothing of a running sandbox")
	}
	c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent)
	if _, st := c.get(id); st != http.StatusNotFound {
		t.Errorf("GET after delete: %d", st)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.objects(id) {
		if time.Now().After(deadline) {
			t.Fatal("the runtime kept objects of a deleted sandbox")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.want("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNotFound)
}

// An expired sandbox is removed from the API and the runtime.
func testExpiry(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	id := c.create(sleeper(map[string]any{"timeout": 3}))
	if !p.objects(id) {
		t.Fatal("the runtime has nothing of a new sandbox")
	}
	c.waitGone(id)
	deadline := time.Now().Add(30 * time.Second)
	for p.objects(id) {
		if time.Now().After(deadline) {
			t.Fatal("the runtime kept objects of an expired sandbox")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A restarted control plane recovers its sandboxes from its store and runtime: same
// status, metadata, expiry and access; execd still answers.
func testRestart(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	id := c.create(sleeper(map[string]any{"metadata": map[string]string{"case": "restart"}}))
	t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
	before := c.waitState(id, opensandbox.Running)
	if out := c.run(id, "echo before"); out != "before" {
		t.Fatalf("before restart: %q", out)
	}
	p.restart()
	after := c.waitState(id, opensandbox.Running)
	if after.Metadata["case"] != "restart" || after.ExpiresAt == nil || !after.ExpiresAt.Equal(*before.ExpiresAt) ||
		!after.CreatedAt.Equal(before.CreatedAt) {
		t.Errorf("after restart %+v, before %+v", after, before)
	}
	if out := c.run(id, "echo after"); out != "after" {
		t.Errorf("after restart: %q", out)
	}
}
