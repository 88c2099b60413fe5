package sdk_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/sdk"
)

const key = "sdk-test-key"

func TestMain(m *testing.M) {
	lctest.Network = "altest-sdk0"
	code := m.Run()
	lctest.RemoveNetwork(lctest.Network)
	os.Exit(code)
}

func newClient(t *testing.T, h *lctest.Harness, hdr http.Header) *sdk.Client {
	t.Helper()
	c, err := sdk.New(sdk.Config{BaseURL: h.HTTP.URL, APIKey: key, Header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLifecycle drives every lifecycle call of the SDK against a real server.
func TestLifecycle(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: key})
	c := newClient(t, h, http.Header{"X-Request-Id": {"sdk-rid"}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: h.Image, Timeout: 5 * time.Minute, Metadata: map[string]string{"who": "sdk"},
		Resources: map[string]string{"cpu": "500m", "memory": "256Mi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status.State != "Pending" || sb.ExpiresAt == nil {
		t.Errorf("created %+v", sb)
	}
	if _, err := c.WaitState(ctx, sb.ID, "Running", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	p, err := c.List(ctx, sdk.ListOptions{States: []string{"running"}, Metadata: map[string]string{"who": "sdk"}})
	if err != nil || len(p.Items) != 1 || p.Items[0].ID != sb.ID || p.Pagination.TotalItems != 1 {
		t.Fatalf("list %+v %v", p, err)
	}
	v := "x"
	got, err := c.PatchMetadata(ctx, sb.ID, map[string]*string{"who": nil, "new": &v})
	if err != nil || got.Metadata["new"] != "x" || got.Metadata["who"] != "" {
		t.Errorf("patch %+v %v", got, err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	if exp, err := c.Renew(ctx, sb.ID, at); err != nil || !exp.Equal(at) {
		t.Errorf("renew %s %v", exp, err)
	}
	ep, err := c.Endpoint(ctx, sb.ID, 44772)
	if err != nil || !strings.HasSuffix(ep.Endpoint, "/sandboxes/"+sb.ID+"/proxy/44772") {
		t.Errorf("endpoint %+v %v", ep, err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var ae *sdk.APIError
	if err := c.Pause(ctx, sb.ID); !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "INVALID_STATE" || ae.RequestID != "sdk-rid" {
		t.Errorf("second pause: %v", err)
	}
	if err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, sb.ID); !sdk.IsNotFound(err) {
		t.Errorf("get after kill: %v", err)
	}
}

// TestExecd runs commands, a session, files and code through the SDK's execd client.
func TestExecd(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: key})
	c := newClient(t, h, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: h.Image, Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var streamed []string
	ex, err := x.Run(ctx, sdk.Command{Command: "echo $GREETING; echo oops >&2; echo two"}, func(ev sdk.Event) error {
		streamed = append(streamed, ev.Type)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ex.Stdout, ",") != "hi,two" || strings.Join(ex.Stderr, ",") != "oops" || ex.ExitCode() != 0 || ex.ID == "" {
		t.Errorf("execution %+v", ex)
	}
	if len(streamed) < 5 || streamed[0] != "init" || streamed[len(streamed)-1] != "execution_complete" {
		t.Errorf("events %v", streamed)
	}
	if ex, err := x.Run(ctx, sdk.Command{Command: "exit 7"}, nil); err != nil || ex.ExitCode() != 7 {
		t.Errorf("exit 7: %+v %v", ex, err)
	}
	bg, err := x.Run(ctx, sdk.Command{Command: "echo bg; sleep 0.2", Background: true}, nil)
	if err != nil || bg.ID == "" {
		t.Fatalf("background %+v %v", bg, err)
	}
	for range 100 {
		st, err := x.CommandStatus(ctx, bg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Running {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if logs, _, err := x.CommandLogs(ctx, bg.ID, 0); err != nil || !strings.Contains(logs, "bg") {
		t.Errorf("logs %q %v", logs, err)
	}
	sid, err := x.CreateSession(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.RunInSession(ctx, sid, "cd /tmp && export V=5", nil); err != nil {
		t.Fatal(err)
	}
	if ex, err := x.RunInSession(ctx, sid, "echo $V $(pwd)", nil); err != nil || strings.Join(ex.Stdout, "") != "5 /tmp" {
		t.Errorf("session %+v %v", ex, err)
	}
	_ = x.DeleteSession(ctx, sid)
	if err := x.WriteFile(ctx, "/tmp/sdk/a.txt", strings.NewReader("content"), 644); err != nil {
		t.Fatal(err)
	}
	if b, err := x.ReadFile(ctx, "/tmp/sdk/a.txt"); err != nil || string(b) != "content" {
		t.Errorf("read %q %v", b, err)
	}
	if fs, err := x.SearchFiles(ctx, "/tmp/sdk", "*.txt"); err != nil || len(fs) != 1 || fs[0].Path != "/tmp/sdk/a.txt" || fs[0].Mode != 644 {
		t.Errorf("search %+v %v", fs, err)
	}
	cc, err := x.CreateContext(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.RunCode(ctx, *cc, "x = 40", nil); err != nil {
		t.Fatal(err)
	}
	ex, err = x.RunCode(ctx, *cc, "x + 2", nil)
	if err != nil || len(ex.Results) != 1 || ex.Results[0]["text"] != "42" {
		t.Errorf("code %+v %v", ex, err)
	}
	if err := x.DeleteContext(ctx, cc.ID); err != nil {
		t.Errorf("delete context: %v", err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
