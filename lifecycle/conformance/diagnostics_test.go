package conformance_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/opensandbox"
)

// The diagnostics API on every runtime: the sandbox's own events (create, transitions,
// the policy version applied) from the store, so they survive a restart (on Kubernetes
// through the Sandbox resource's status); the runtime's events and logs as the runtime
// has them (a warning when it cannot); the download form; 404 and 401.
func testDiagnostics(t *testing.T, p *plane) {
	c := p.c
	c.t = t
	id := c.create(sleeper(map[string]any{"networkPolicy": map[string]any{"defaultAction": "deny",
		"egress": []map[string]any{{"action": "allow", "target": "pypi.org"}}}}))
	t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
	c.waitState(id, opensandbox.Running)
	describe := func(kind, query string) opensandbox.DiagnosticContent {
		t.Helper()
		var d opensandbox.DiagnosticContent
		if err := json.Unmarshal(c.want("GET", "/v1/sandboxes/"+id+"/diagnostics/"+kind+"?"+query, nil, http.StatusOK), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	inline := func(d opensandbox.DiagnosticContent) string {
		t.Helper()
		if d.Delivery != opensandbox.DeliveryInline || d.Content == nil {
			t.Fatalf("descriptor %+v: want inline content", d)
		}
		return *d.Content
	}
	wantEvents := []string{"lifecycle Normal Created sandbox created: image airlock/sandbox:latest",
		"network Normal PolicyApplied policy version 1 stored (at create)", "lifecycle Normal Pending", "lifecycle Normal Running"}
	check := func(when string) {
		t.Helper()
		all := inline(describe("events", "scope=all"))
		for _, want := range wantEvents {
			if !strings.Contains(all, want) {
				t.Errorf("%s: events lack %q:\n%s", when, want, all)
			}
		}
	}
	check("before restart")
	p.restart()
	c.waitState(id, opensandbox.Running)
	check("after restart")

	// The runtime's side answers 200 whatever it can read; what it cannot is a warning.
	// Docker: the container's state; Kubernetes: the pod's status (the test kubelet
	// writes no Events).
	rt := describe("events", "scope=runtime")
	if text := inline(rt); !strings.Contains(text, "runtime Normal Started") && !strings.Contains(text, "runtime Normal PodScheduled") {
		t.Errorf("runtime events: %q, warnings %q", text, rt.Warnings)
	}
	logs := describe("logs", "scope=container")
	_ = inline(logs)

	d := describe("events", "scope=lifecycle&delivery=url")
	if d.Delivery != opensandbox.DeliveryURL || d.ContentURL == "" || d.ExpiresAt == nil || d.Content != nil {
		t.Fatalf("url descriptor %+v", d)
	}
	resp, err := http.Get(d.ContentURL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "lifecycle Normal Created") || strings.Contains(string(b), " network ") {
		t.Errorf("download: %d\n%s", resp.StatusCode, b)
	}

	if st, b := c.do("GET", "/v1/sandboxes/nosuchsandbox00/diagnostics/events?scope=all", nil); st != http.StatusNotFound || !strings.Contains(string(b), "SANDBOX_NOT_FOUND") {
		t.Errorf("unknown sandbox: %d %s", st, b)
	}
	if st, b := c.do("GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=container", nil, opensandbox.HeaderAPIKey, "wrong"); st != http.StatusUnauthorized || !strings.Contains(string(b), "UNAUTHORIZED") {
		t.Errorf("wrong key: %d %s", st, b)
	}
}
