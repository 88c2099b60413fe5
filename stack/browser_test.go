package stack

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/runtime"

	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// browserPoolLimits are the resourceLimits of the browser warm pool in these tests; a
// create with other limits is served cold.
var browserPoolLimits = map[string]string{"cpu": "1", "memory": "1Gi"}

// browserStack starts `airlock up` with the datapath mode and a warm pool of size
// browser sandboxes whose Chromium starts when they warm (none when size is 0).
func browserStack(t *testing.T, mode string, size int) (*Stack, *sdk.Client) {
	t.Helper()
	img := testenv.NeedBrowserImage(t)
	testenv.NeedBPF(t)
	return startTestStack(t, func(cfg *Config) {
		cfg.Egress.Mode = mode
		if size > 0 {
			// Chromium starts when a member warms: a claim finds it up.
			cfg.Pools = []PoolConfig{{Name: "browser", Image: img, Size: size, ResourceLimits: browserPoolLimits,
				Entrypoint: []string{"/opt/airlock/browser.sh"}, ReadyPort: opensandbox.CDPPort,
				ReadyPath: "/json/version"}}
		}
	})
}

// waitPoolReady waits until s's first pool has every member ready.
func waitPoolReady(ctx context.Context, t testing.TB, s *Stack) {
	t.Helper()
	for {
		p := s.Lifecycle.Pools()[0]
		if p.Ready == p.Size && p.Warming == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("warm pool not ready: %+v", p)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sandboxAddr is the sandbox's own address with port (what "direct" measures against).
func sandboxAddr(ctx context.Context, t testing.TB, s *Stack, id string, port int) string {
	t.Helper()
	insts, err := s.Docker.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.SandboxID == id {
			return net.JoinHostPort(in.Address.String(), strconv.Itoa(port))
		}
	}
	t.Fatalf("sandbox %s has no address", id)
	return ""
}

// evalOnePlusOne runs Runtime.evaluate of 1+1 on sess and checks the answer.
func evalOnePlusOne(ctx context.Context, sess cdp.Session) error {
	res, err := cdp.Call(ctx, sess, runtime.Evaluate, runtime.EvaluateParams{Expression: "1+1", ReturnByValue: new(true)})
	if err != nil {
		return err
	}
	if res.ExceptionDetails != nil || string(res.Result.Value) != "2" {
		return &unexpected{what: "1+1 = " + string(res.Result.Value)}
	}
	return nil
}

type unexpected struct{ what string }

func (u *unexpected) Error() string { return "unexpected " + u.what }

// TestStackBrowserPool: a warm pool of the browser image serves a create with its
// limits; the claimed sandbox reports it, its DevTools endpoint needs the credential
// (401 without, through the gateway) and drives Chromium with it (Runtime.evaluate
// over the rewritten WebSocket URL), on both datapaths. The members' Chromium started
// when they warmed; a create that adds env is served cold and works the same.
func TestStackBrowserPool(t *testing.T) {
	for _, mode := range []string{"ebpf", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			s, c := browserStack(t, mode, 1)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			waitPoolReady(ctx, t, s)
			img := testenv.BrowserImage()
			t0 := time.Now()
			sb, err := c.Create(ctx, browserCreate(img, browserPoolLimits))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill(context.Background(), sb.ID)
			got, err := c.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.State != opensandbox.Running || !strings.Contains(got.Status.Message, "warm pool browser") {
				t.Fatalf("the create was not served by the pool: %+v", got.Status)
			}
			base, hdr := cdpEndpoint(ctx, t, c, sb.ID)
			if err := waitCDP(ctx, base, hdr); err != nil {
				t.Fatal(err)
			}
			t.Logf("[%s] pooled browser sandbox: create → CDP ready in %s", mode, time.Since(t0))
			var v map[string]any
			if err := cdpJSON(ctx, base, "/json/version", http.Header{}, &v); err == nil || !strings.Contains(err.Error(), "401") {
				t.Fatalf("/json/version without the credential: %v, want 401", err)
			}
			page := firstPage(ctx, t, base, hdr)
			if !strings.HasPrefix(page.WebSocketDebuggerURL, "ws://"+strings.TrimPrefix(base, "http://")+"/devtools/page/") {
				t.Fatalf("webSocketDebuggerUrl %q not rewritten to %s", page.WebSocketDebuggerURL, base)
			}
			if _, err := dialCDP(ctx, page.WebSocketDebuggerURL, nil); err == nil {
				t.Fatal("the DevTools WebSocket opened without the credential")
			}
			sess, err := dialCDP(ctx, page.WebSocketDebuggerURL, hdr)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			if err := evalOnePlusOne(ctx, sess); err != nil {
				t.Fatal(err)
			}
			// The pool's members run their entrypoint already: a create that adds env
			// cannot be one of them and is served cold, and works the same.
			req := browserCreate(img, browserPoolLimits)
			req.Env = map[string]string{"AIRLOCK_TEST": "1"}
			cold, err := c.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill(context.Background(), cold.ID)
			if got, err := c.WaitState(ctx, cold.ID, opensandbox.Running, 50*time.Millisecond); err != nil || strings.Contains(got.Status.Message, "warm pool") {
				t.Fatalf("a create with env: %+v %v, want served cold", got, err)
			}
			cbase, chdr := cdpEndpoint(ctx, t, c, cold.ID)
			if err := waitCDP(ctx, cbase, chdr); err != nil {
				t.Fatal(err)
			}
		})
	}
}
