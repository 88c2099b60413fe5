package lifecycle_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/opensandbox"
)

// diag fetches a diagnostics descriptor and checks its shape against
// DiagnosticContentResponse (diagnostic-api.yml): only the spec's properties, content
// exactly for inline, contentUrl and expiresAt exactly for url.
func (c *client) diag(id, kind, scope, delivery string) opensandbox.DiagnosticContent {
	c.t.Helper()
	q := url.Values{"scope": {scope}}
	if delivery != "" {
		q.Set("delivery", delivery)
	}
	b := c.want("GET", "/v1/sandboxes/"+id+"/diagnostics/"+kind+"?"+q.Encode(), nil, http.StatusOK, "")
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		c.t.Fatal(err)
	}
	allowed := []string{"sandboxId", "kind", "scope", "delivery", "contentType", "content", "contentUrl", "contentLength", "expiresAt", "truncated", "warnings"}
	for k := range raw {
		if !slices.Contains(allowed, k) {
			c.t.Errorf("descriptor has %q, which DiagnosticContentResponse does not allow: %s", k, b)
		}
	}
	for _, k := range []string{"sandboxId", "kind", "scope", "delivery", "contentType", "truncated"} {
		if _, ok := raw[k]; !ok {
			c.t.Errorf("descriptor lacks required %q: %s", k, b)
		}
	}
	var d opensandbox.DiagnosticContent
	if err := json.Unmarshal(b, &d); err != nil {
		c.t.Fatal(err)
	}
	_, hasContent := raw["content"]
	_, hasURL := raw["contentUrl"]
	_, hasExp := raw["expiresAt"]
	switch d.Delivery {
	case opensandbox.DeliveryInline:
		if !hasContent || hasURL || hasExp {
			c.t.Errorf("inline descriptor: content %v, contentUrl %v, expiresAt %v: %s", hasContent, hasURL, hasExp, b)
		}
	case opensandbox.DeliveryURL:
		if hasContent || !hasURL || !hasExp {
			c.t.Errorf("url descriptor: content %v, contentUrl %v, expiresAt %v: %s", hasContent, hasURL, hasExp, b)
		}
	default:
		c.t.Errorf("delivery %q", d.Delivery)
	}
	if d.SandboxID != id || d.Kind != kind || d.Scope != scope || d.ContentType != "text/plain; charset=utf-8" {
		c.t.Errorf("descriptor %s", b)
	}
	return d
}

func text(d opensandbox.DiagnosticContent) string {
	if d.Content == nil {
		return ""
	}
	return *d.Content
}

// A sandbox whose entrypoint prints lines and exits 3: its diagnostics show the exit
// code and the last lines, inline and through the download URL.
func TestDiagnosticsExitedSandbox(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey, ResyncInterval: 200 * time.Millisecond})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["entrypoint"] = []string{"sh", "-c", "for i in 1 2 3 4 5; do echo line-$i; done; echo oops-on-stderr >&2; exit 3"}
	sb := c.create(req)
	c.waitState(sb.ID, opensandbox.Failed)

	logs := c.diag(sb.ID, "logs", "container", "")
	got := text(logs)
	for _, want := range []string{"line-1", "line-5", "oops-on-stderr"} {
		if !strings.Contains(got, want) {
			t.Errorf("container logs lack %q:\n%s", want, got)
		}
	}
	// Every line carries its timestamp.
	for line := range strings.Lines(got) {
		ts, _, _ := strings.Cut(line, " ")
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("log line without a timestamp: %q", line)
		}
	}
	if logs.Truncated || logs.ContentLength == nil || *logs.ContentLength != int64(len(got)) {
		t.Errorf("truncated %v, contentLength %v for %d bytes", logs.Truncated, logs.ContentLength, len(got))
	}

	rt := text(c.diag(sb.ID, "events", "runtime", ""))
	if !strings.Contains(rt, "Exited container exited with exit code 3") || !strings.Contains(rt, "runtime Normal Started") {
		t.Errorf("runtime events lack the start and the exit code 3:\n%s", rt)
	}
	all := text(c.diag(sb.ID, "events", "all", ""))
	for _, want := range []string{"lifecycle Normal Created", "lifecycle Warning Failed state Failed (container_exited)", "exit code 3"} {
		if !strings.Contains(all, want) {
			t.Errorf("all events lack %q:\n%s", want, all)
		}
	}

	t.Run("download", func(t *testing.T) {
		d := c.diag(sb.ID, "logs", "container", "url")
		if d.ExpiresAt == nil || !d.ExpiresAt.After(time.Now()) || d.ContentLength == nil || *d.ContentLength != int64(len(got)) {
			t.Fatalf("url descriptor: expiresAt %v, contentLength %v", d.ExpiresAt, d.ContentLength)
		}
		u, err := url.Parse(d.ContentURL)
		if err != nil || !u.IsAbs() {
			t.Fatalf("contentUrl %q is not an absolute URL", d.ContentURL)
		}
		// The URL is the credential: no API key.
		resp, err := http.Get(d.ContentURL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("download: %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if string(body) != got {
			t.Errorf("downloaded text differs from the inline one:\n%s\n---\n%s", body, got)
		}
		// A URL whose signature or expiry was changed admits nothing.
		q := u.Query()
		q.Set("expires", "9999999999")
		u.RawQuery = q.Encode()
		anon := &client{t: t, base: ""}
		anon.want("GET", u.String(), nil, http.StatusUnauthorized, "UNAUTHORIZED")
		q = u.Query()
		q.Del("signature")
		u.RawQuery = q.Encode()
		anon.want("GET", u.String(), nil, http.StatusUnauthorized, "UNAUTHORIZED")

		ev := c.diag(sb.ID, "events", "all", "url")
		resp, err = http.Get(ev.ContentURL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "exit code 3") {
			t.Errorf("events download: %d:\n%s", resp.StatusCode, body)
		}
	})
}

// A running sandbox's events: create and start, the policy version applied and
// confirmed enforced, egress attached before release; and the errors of the routes.
func TestDiagnosticsRunningSandbox(t *testing.T) {
	var gated atomic.Int32
	h := lctest.New(t, lctest.Options{
		APIKey:     testKey,
		ReadyGate:  func(string) bool { gated.Add(1); return true },
		PolicyGate: func(string, uint64) bool { return true },
	})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["entrypoint"] = []string{"sh", "-c", "echo hello-from-entrypoint; exec tail -f /dev/null"}
	req["networkPolicy"] = map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}}
	sb := c.create(req)
	c.waitState(sb.ID, opensandbox.Running)
	c.want("PATCH", "/v1/sandboxes/"+sb.ID+"/policy", `[{"action":"allow","target":"example.com"}]`, http.StatusOK, "")

	life := text(c.diag(sb.ID, "events", "lifecycle", ""))
	for _, want := range []string{"lifecycle Normal Created sandbox created: image " + h.Image, "lifecycle Normal ContainerCreated docker runtime: container",
		"lifecycle Normal Pending", "lifecycle Normal Released execd started the entrypoint", "lifecycle Normal Running"} {
		if !strings.Contains(life, want) {
			t.Errorf("lifecycle events lack %q:\n%s", want, life)
		}
	}
	if strings.Contains(life, " network ") {
		t.Errorf("lifecycle scope carries network events:\n%s", life)
	}
	network := text(c.diag(sb.ID, "events", "network", ""))
	for _, want := range []string{"network Normal PolicyApplied policy version 1 stored (at create)",
		"network Normal EgressAttached the data plane enforces the sandbox's egress (policy version 1)",
		"network Normal PolicyApplied policy version 2 stored (policy API)",
		"network Normal PolicyEnforced the data plane confirms policy version 2 enforced"} {
		if !strings.Contains(network, want) {
			t.Errorf("network events lack %q:\n%s", want, network)
		}
	}
	rt := text(c.diag(sb.ID, "events", "runtime", ""))
	if !strings.Contains(rt, "runtime Normal ContainerCreated") || !strings.Contains(rt, "runtime Normal Started") || strings.Contains(rt, "Exited") {
		t.Errorf("runtime events of a running sandbox:\n%s", rt)
	}
	all := text(c.diag(sb.ID, "events", "all", ""))
	// In time order: created before attached before released before running.
	idx := func(s string) int { return strings.Index(all, s) }
	if !(idx("Normal Created") < idx("EgressAttached") && idx("EgressAttached") < idx("Released") && idx("Released") < idx("Normal Running")) {
		t.Errorf("events out of order:\n%s", all)
	}
	if logs := text(c.diag(sb.ID, "logs", "all", "")); !strings.Contains(logs, "hello-from-entrypoint") {
		t.Errorf("logs lack the entrypoint's output:\n%s", logs)
	}

	t.Run("errors", func(t *testing.T) {
		anon := &client{t: t, base: h.HTTP.URL}
		for _, p := range []string{"/v1/sandboxes/" + sb.ID + "/diagnostics/logs?scope=container", "/sandboxes/" + sb.ID + "/diagnostics/events?scope=all"} {
			anon.want("GET", p, nil, http.StatusUnauthorized, "UNAUTHORIZED")
		}
		anon.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/logs/download?scope=container", nil, http.StatusUnauthorized, "UNAUTHORIZED")
		c.want("GET", "/v1/sandboxes/nosuchsandbox00/diagnostics/logs?scope=container", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		c.want("GET", "/v1/sandboxes/nosuchsandbox00/diagnostics/events?scope=all", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		c.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/logs", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/logs?scope=runtime", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/events?scope=process", nil, http.StatusBadRequest, "INVALID_REQUEST")
		c.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/events?scope=all&delivery=carrier", nil, http.StatusBadRequest, "INVALID_REQUEST")
	})

	t.Run("deleted", func(t *testing.T) {
		d := c.diag(sb.ID, "events", "all", "url")
		c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
		c.want("GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/events?scope=all", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
		anon := &client{t: t, base: ""}
		anon.want("GET", d.ContentURL, nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	})
}

// A sandbox whose process outgrows its memory limit: the OOM kill and the exit code
// (128+SIGKILL) are in its runtime events.
func TestDiagnosticsOOMKill(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey, ResyncInterval: 200 * time.Millisecond})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["resourceLimits"] = map[string]string{"cpu": "500m", "memory": "64Mi"}
	req["entrypoint"] = []string{"python3", "-c", "print('allocating', flush=True); b = bytearray(512 << 20); print('survived')"}
	sb := c.create(req)
	c.waitState(sb.ID, opensandbox.Failed)
	rt := text(c.diag(sb.ID, "events", "runtime", ""))
	if !strings.Contains(rt, "exit code 137") {
		t.Errorf("runtime events lack the exit code 137:\n%s", rt)
	}
	if !strings.Contains(rt, "runtime Warning OOMKilling") && !strings.Contains(rt, "OOM killed") {
		t.Errorf("runtime events lack the OOM kill:\n%s", rt)
	}
	if logs := text(c.diag(sb.ID, "logs", "container", "")); !strings.Contains(logs, "Z allocating\n") || strings.Contains(logs, "Z survived\n") {
		t.Errorf("logs:\n%s", logs)
	}
}
