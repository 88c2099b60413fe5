package stack

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// TestStackPause: across a pause the sandbox keeps its egress enforcement and its
// expiry; while paused its routes answer 409 with the JSON envelope, at the gateway and
// at lifecycle's server proxy, and an access neither resumes it nor renews it (renew
// on access); after resume the same policy is in force and access renews again.
func TestStackPause(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	s, c := startTestStack(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, NetworkPolicy: pol, Timeout: 10 * time.Minute,
		Extensions: map[string]string{"access.renew.extend.seconds": "3600"}})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing reaches the sandbox through the gateway before the pause: the first
	// access would claim the renew throttle (one intent a minute) and hide a renew
	// sent while paused.
	if _, err := c.WaitState(ctx, sb.ID, "Running", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Egress.Datapath().Attached(), sb.ID) {
		t.Fatalf("egress not enforced on a Running sandbox")
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(name string) string {
		t.Helper()
		ex, err := x.Run(ctx, sdk.Command{Command: "getent hosts " + name + " | cut -d' ' -f1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(strings.Join(ex.Stdout, ""))
	}
	ep, err := c.Endpoint(ctx, sb.ID, 44772)
	if err != nil {
		t.Fatal(err)
	}
	get := func(url string, hdr map[string]string) (int, map[string]string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	waitExpiry := func(after time.Time) *sdk.Sandbox {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			cur, err := c.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if cur.ExpiresAt.After(after) || time.Now().After(deadline) {
				return cur
			}
		}
	}

	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitState(ctx, sb.ID, "Paused", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	before, _ := c.Get(ctx, sb.ID)
	if code, body := get("http://"+ep.Endpoint+"/ping", ep.Headers); code != http.StatusConflict || body["code"] != "SANDBOX_PAUSED" || body["message"] == "" {
		t.Errorf("gateway while paused: %d %v, want 409 SANDBOX_PAUSED", code, body)
	}
	if code, body := get("http://"+s.Addr.String()+"/sandboxes/"+sb.ID+"/proxy/44772/ping",
		map[string]string{"OPEN-SANDBOX-API-KEY": s.APIKey}); code != http.StatusConflict || body["code"] != "INVALID_STATE" {
		t.Errorf("server proxy while paused: %d %v, want 409 INVALID_STATE", code, body)
	}
	if cur := waitExpiry(*before.ExpiresAt); cur.Status.State != "Paused" || !cur.ExpiresAt.Equal(*before.ExpiresAt) {
		t.Errorf("an access while paused changed the sandbox: %s, expiry %s → %s", cur.Status.State, before.ExpiresAt, cur.ExpiresAt)
	}
	if !slices.Contains(s.Egress.Datapath().Attached(), sb.ID) {
		t.Errorf("egress enforcement detached while paused")
	}

	if err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitState(ctx, sb.ID, "Running", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if code, body := get("http://"+ep.Endpoint+"/ping", ep.Headers); code != http.StatusOK {
		t.Errorf("gateway after resume: %d %v", code, body)
	}
	if cur := waitExpiry(*before.ExpiresAt); !cur.ExpiresAt.After(*before.ExpiresAt) {
		t.Errorf("an access after resume did not renew: expiry %s", cur.ExpiresAt)
	}
	if a, d := resolve("allowed.test"), resolve("denied.test"); a != "203.0.113.10" || d != "" {
		t.Errorf("after resume: allowed.test %q, denied.test %q", a, d)
	}
}
