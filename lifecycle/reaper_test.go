package lifecycle_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	dockerclient "github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestExpiry: a sandbox past expiresAt is removed by the reaper (container and record);
// a renewed one outlives its first deadline; a manual-cleanup one never expires; a
// paused one expires like a running one (pause does not stop the clock).
func TestExpiry(t *testing.T) {
	h := lctest.New(t, lctest.Options{
		APIKey:       testKey,
		Limits:       lifecycle.Limits{MinTimeout: time.Second},
		ReapInterval: 200 * time.Millisecond,
	})
	c := newClient(t, h)
	short := baseReq(h.Image, map[string]string{"kind": "short"})
	short["timeout"] = 2
	renewed := baseReq(h.Image, map[string]string{"kind": "renewed"})
	renewed["timeout"] = 2
	manual := baseReq(h.Image, map[string]string{"kind": "manual"})
	delete(manual, "timeout")

	pausedShort := baseReq(h.Image, map[string]string{"kind": "paused"})
	pausedShort["timeout"] = 2
	sPaused := c.create(pausedShort)
	c.waitState(sPaused.ID, opensandbox.Running)
	c.want("POST", "/v1/sandboxes/"+sPaused.ID+"/pause", nil, http.StatusAccepted, "")
	sShort := c.create(short)
	sRenewed := c.create(renewed)
	c.want("POST", "/v1/sandboxes/"+sRenewed.ID+"/renew-expiration",
		map[string]any{"expiresAt": time.Now().Add(10 * time.Minute)}, http.StatusOK, "")
	sManual := c.create(manual)
	if sManual.ExpiresAt != nil {
		t.Fatalf("manual cleanup sandbox has expiresAt")
	}

	// Bounded wait for the reaper (expiry is 2 s away; the bound is generous).
	for _, id := range []string{sShort.ID, sPaused.ID} {
		gone := false
		for range 300 {
			resp, _ := c.do("GET", "/v1/sandboxes/"+id, nil)
			if resp.StatusCode == http.StatusNotFound {
				gone = true
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !gone {
			t.Fatalf("expired sandbox %s still listed after 30 s", id)
		}
	}
	// The renewed one had the same first deadline: it is well past it now.
	if sb := c.get(sRenewed.ID); sb.Status.State.Terminal() {
		t.Errorf("renewed sandbox is %s", sb.Status.State)
	}
	c.get(sManual.ID)
	insts, err := h.Runtime.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.SandboxID == sShort.ID || in.SandboxID == sPaused.ID {
			t.Errorf("container of the expired sandbox is still there")
		}
	}
	if len(insts) != 2 {
		t.Errorf("%d containers, want 2", len(insts))
	}
}

// TestReconcile: on start the server removes its orphan containers (no record), marks
// sandboxes whose container vanished Terminated, adopts the rest with their state, and
// leaves other instances' containers alone.
func TestReconcile(t *testing.T) {
	dir := t.TempDir()
	h1 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir, KeepContainers: true})
	c := newClient(t, h1)
	keep := c.create(baseReq(h1.Image, map[string]string{"kind": "keep"}))
	paused := c.create(baseReq(h1.Image, map[string]string{"kind": "paused"}))
	vanish := c.create(baseReq(h1.Image, map[string]string{"kind": "vanish"}))
	c.waitState(paused.ID, opensandbox.Running)
	c.want("POST", "/v1/sandboxes/"+paused.ID+"/pause", nil, http.StatusAccepted, "")
	inst := h1.Server.InstanceID()
	h1.Stop()

	cli := lctest.Docker(t)
	ctx := t.Context()
	// The vanished sandbox's container goes away behind the server's back.
	vres, err := cli.ContainerList(ctx, dockerclient.ContainerListOptions{All: true, Filters: dockerclient.Filters{}.Add("label", docker.LabelSandboxID+"="+vanish.ID)})
	if err != nil || len(vres.Items) != 1 {
		t.Fatalf("vanish container: %v %v", vres.Items, err)
	}
	if _, err := cli.ContainerRemove(ctx, vres.Items[0].ID, dockerclient.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	// An orphan: a container of this instance without a record (a create cut short).
	orphan := makeContainer(t, cli, h1.Image, lctest.NamePrefix+"orphan-"+inst, map[string]string{
		docker.LabelInstance: inst, docker.LabelSandboxID: "orphanid", docker.LabelManagedBy: "airlock",
	})
	// Another instance's container must survive.
	foreign := makeContainer(t, cli, h1.Image, lctest.NamePrefix+"foreign-"+inst, map[string]string{
		docker.LabelInstance: "someoneelse", docker.LabelSandboxID: "x", docker.LabelManagedBy: "airlock",
	})

	h2 := lctest.New(t, lctest.Options{APIKey: testKey, StateDir: dir})
	c2 := newClient(t, h2)
	if _, err := cli.ContainerInspect(ctx, orphan, dockerclient.ContainerInspectOptions{}); err == nil {
		t.Errorf("orphan container still exists")
	}
	if _, err := cli.ContainerInspect(ctx, foreign, dockerclient.ContainerInspectOptions{}); err != nil {
		t.Errorf("another instance's container was touched: %v", err)
	}
	if st := c2.get(vanish.ID).Status; st.State != opensandbox.Terminated || st.Reason != "container_vanished" {
		t.Errorf("vanished sandbox status %+v", st)
	}
	if sb := c2.waitState(keep.ID, opensandbox.Running); sb.Metadata["kind"] != "keep" || !sb.ExpiresAt.Equal(*keep.ExpiresAt) {
		t.Errorf("adopted sandbox %+v", sb)
	}
	if st := c2.get(paused.ID).Status.State; st != opensandbox.Paused {
		t.Errorf("paused sandbox adopted as %s", st)
	}
	// Adopted sandboxes are usable.
	c2.want("POST", "/v1/sandboxes/"+paused.ID+"/resume", nil, http.StatusAccepted, "")
	c2.want("GET", "/sandboxes/"+keep.ID+"/proxy/44772/ping", nil, http.StatusOK, "")
	// The watch carries the adopted sandboxes with their pid.
	w, ok := h2.Server.Hub().Get(keep.ID)
	if !ok || w.Runtime.Pid == 0 || !w.Address.IsValid() {
		t.Errorf("watch view of adopted sandbox: %+v", w)
	}
	// Deleting the Terminated one clears it.
	c2.want("DELETE", "/v1/sandboxes/"+vanish.ID, nil, http.StatusNoContent, "")
	var l lifecycle.ListResponse
	_ = json.Unmarshal(c2.want("GET", "/v1/sandboxes", nil, http.StatusOK, ""), &l)
	if l.Pagination.TotalItems != 2 {
		t.Errorf("%d sandboxes listed, want 2", l.Pagination.TotalItems)
	}
}

// makeContainer runs a plain container with labels and removes it at the end.
func makeContainer(t *testing.T, cli *dockerclient.Client, img, name string, labels map[string]string) string {
	t.Helper()
	ctx := t.Context()
	res, err := cli.ContainerCreate(ctx, dockerclient.ContainerCreateOptions{
		Name:       name,
		Config:     &container.Config{Image: img, Entrypoint: []string{"sleep", "600"}, Labels: labels},
		HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(lctest.Network)},
		NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			lctest.Network: {},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cli.ContainerRemove(context.Background(), res.ID, dockerclient.ContainerRemoveOptions{Force: true})
	})
	if _, err := cli.ContainerStart(ctx, res.ID, dockerclient.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	return res.ID
}
