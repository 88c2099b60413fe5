package docker_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestMaxPTYSessions: Config.MaxPTYSessions reaches every sandbox's execd
// (--max-pty-sessions), which then refuses a PTY session past it with 409
// PTY_LIMIT_EXCEEDED.
func TestMaxPTYSessions(t *testing.T) {
	rt, cli, img := newRuntime(t, func(c *docker.Config) { c.MaxPTYSessions = 1 })
	ctx := t.Context()
	inst, err := rt.Create(ctx, spec("dkpty1", img))
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.ContainerInspect(ctx, inst.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ep := res.Container.Config.Entrypoint; !slices.Contains(ep, "--max-pty-sessions") || ep[slices.Index(ep, "--max-pty-sessions")+1] != "1" {
		t.Errorf("entrypoint %q has no --max-pty-sessions 1", ep)
	}
	base := "http://" + netip.AddrPortFrom(inst.Address, opensandbox.ExecdPort).String()
	post := func() (int, opensandbox.ErrorBody) {
		resp, err := http.Post(base+"/pty", "application/json", strings.NewReader(`{}`))
		if err != nil {
			return 0, opensandbox.ErrorBody{}
		}
		defer resp.Body.Close()
		var e opensandbox.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	var st int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st, _ = post(); st != 0 {
			break
		}
	}
	if st != http.StatusCreated {
		t.Fatalf("first POST /pty: %d", st)
	}
	if st, e := post(); st != http.StatusConflict || e.Code != "PTY_LIMIT_EXCEEDED" || e.Message == "" {
		t.Errorf("second POST /pty: %d %+v, want 409 PTY_LIMIT_EXCEEDED", st, e)
	}
}
