package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// TestStackSnapshotPinsNamedPolicy: a snapshot of a sandbox under a named policy keeps
// that policy at its version; a restore enforces it (egressd's DNS filter, before the
// entrypoint) even after the library moved on, and stays pinned through later library
// edits and its own additions (PATCH), while a fresh sandbox under the same name and
// the snapshot's source follow the library; PUT ?name= unpins the restore.
func TestStackSnapshotPinsNamedPolicy(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	zone := map[string]netip.Addr{}
	for i, n := range []string{"a.test.", "b.test.", "c.test.", "d.test."} {
		zone[n] = netip.AddrFrom4([4]byte{203, 0, 113, byte(20 + i)})
	}
	resolver := dnstest.Serve(t, dnstest.Zone(zone, 60))
	dir := t.TempDir()
	write := func(targets ...string) { // team.yaml allowing targets, renamed over the old one
		t.Helper()
		var b strings.Builder
		b.WriteString("defaultAction: deny\negress:\n")
		for _, tg := range targets {
			fmt.Fprintf(&b, "  - action: allow\n    target: %s\n", tg)
		}
		tmp := filepath.Join(dir, ".team.tmp")
		if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "team.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	write("a.test")
	s, c := startTestStack(t, func(cfg *Config) {
		cfg.Gateway = GatewayConfig{Disabled: true}
		cfg.Egress.Upstreams = []string{resolver}
		cfg.Policies = PoliciesConfig{Dir: dir}
	})
	t.Cleanup(func() { // images of snapshots the test left
		out, _ := exec.Command("docker", "images", "-q", "--filter", "label=airlock.dev/snapshot").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	base := "http://" + s.Addr.String() + "/v1"
	api := func(method, path string, body any, want int, out any) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, base+path, rd)
		req.Header.Set(opensandbox.HeaderAPIKey, s.APIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
	}
	ready := func(id string) *sdk.Execd {
		t.Helper()
		x, err := c.Execd(ctx, id)
		if err == nil {
			err = x.WaitReady(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	start := func() (string, *sdk.Execd) {
		t.Helper()
		sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, Timeout: 10 * time.Minute,
			Extensions: map[string]string{lifecycle.ExtPolicy: "team"}})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID, ready(sb.ID)
	}
	// resolvable lists which of a..d.test resolve in the sandbox (egressd's DNS filter).
	resolvable := func(x *sdk.Execd) string {
		t.Helper()
		ex, err := x.Run(ctx, sdk.Command{Command: `for n in a b c d; do getent hosts $n.test >/dev/null && printf $n; done; echo`}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(ex.Stdout, "")
	}
	eventually := func(x *sdk.Execd, want string) {
		t.Helper()
		got := ""
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = resolvable(x); got == want {
				return
			}
		}
		t.Fatalf("the sandbox resolves %q, want %q", got, want)
	}
	policy := func(id string) lifecycle.PolicyResponse {
		t.Helper()
		var p lifecycle.PolicyResponse
		api("GET", "/sandboxes/"+id+"/policy", nil, http.StatusOK, &p)
		return p
	}

	// v1 of team allows a.test; the source runs it and is snapshotted.
	srcID, src := start()
	if got := resolvable(src); got != "a" {
		t.Fatalf("the source under team v1 resolves %q, want a", got)
	}
	var sn lifecycle.Snapshot
	api("POST", "/sandboxes/"+srcID+"/snapshots", map[string]any{}, http.StatusAccepted, &sn)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", "airlock/snapshot:"+sn.ID).Run() })
	for deadline := time.Now().Add(3 * time.Minute); sn.Status.State == lifecycle.SnapshotCreating && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		api("GET", "/snapshots/"+sn.ID, nil, http.StatusOK, &sn)
	}
	if sn.Status.State != lifecycle.SnapshotReady {
		t.Fatalf("snapshot %+v", sn)
	}

	// The library moves to v2 (b.test only): the source follows it.
	write("b.test")
	eventually(src, "b")

	// A restore enforces v1, from its first packet; a fresh sandbox gets v2.
	var restored lifecycle.Sandbox
	api("POST", "/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600,
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"}}, http.StatusAccepted, &restored)
	rx := ready(restored.ID)
	if got := resolvable(rx); got != "a" {
		t.Fatalf("the restore resolves %q, want a (team at the snapshot's version 1)", got)
	}
	freshID, fresh := start()
	if got := resolvable(fresh); got != "b" {
		t.Fatalf("a fresh sandbox under team resolves %q, want b (version 2)", got)
	}
	p := policy(restored.ID)
	if p.Name != "team" || p.Pinned == nil || p.Pinned.Version != 1 || p.Pinned.LibraryVersion != 2 || p.Pinned.SnapshotID != sn.ID ||
		len(p.Pinned.SHA256) != 64 || !strings.Contains(string(p.Policy), "a.test") || strings.Contains(string(p.Policy), "b.test") {
		t.Errorf("policy of the restore: %+v pinned %+v", p, p.Pinned)
	}
	if fp := policy(freshID); fp.Name != "team" || fp.Pinned != nil {
		t.Errorf("policy of the fresh sandbox: %+v", fp)
	}

	// Later edits of the library do not reach the pinned restore; its additions do.
	write("c.test")
	eventually(fresh, "c")
	eventually(src, "c")
	if got := resolvable(rx); got != "a" {
		t.Errorf("after the library's v3 the restore resolves %q, want a (pinned)", got)
	}
	api("PATCH", "/sandboxes/"+restored.ID+"/policy", []map[string]string{{"action": "allow", "target": "d.test"}}, http.StatusOK, nil)
	if got := resolvable(rx); got != "ad" {
		t.Errorf("after a PATCH the restore resolves %q, want ad (pinned v1 plus its addition)", got)
	}
	if p := policy(restored.ID); p.Pinned == nil || p.Pinned.Version != 1 || p.Pinned.LibraryVersion != 3 {
		t.Errorf("after a PATCH: %+v pinned %+v", p, p.Pinned)
	}
	var named lifecycle.NamedPolicy
	api("GET", "/policies/team", nil, http.StatusOK, &named)
	if named.Version != 3 || named.Sandboxes != 3 || named.Pinned != 1 {
		t.Errorf("library's team: version %d, %d sandboxes, %d pinned; want 3, 3, 1", named.Version, named.Sandboxes, named.Pinned)
	}

	// PUT ?name= unpins: the restore follows the library's current version.
	before := policy(restored.ID).Version
	var after lifecycle.PolicyResponse
	api("PUT", "/sandboxes/"+restored.ID+"/policy?name=team", nil, http.StatusOK, &after)
	if after.Pinned != nil || after.Name != "team" || after.Version <= before {
		t.Errorf("after unpinning: %+v (version before %d)", after, before)
	}
	if got := resolvable(rx); got != "c" {
		t.Errorf("after unpinning the restore resolves %q, want c (team v3)", got)
	}
	write("b.test", "c.test")
	eventually(rx, "bc")
	api("DELETE", "/snapshots/"+sn.ID, nil, http.StatusNoContent, nil)
}
