package stack

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
)

// benchPage is what the screenshot bench renders: text, colours and a gradient over
// 1280×800, so the PNG is not trivially small. A data: URL needs no network.
const benchPage = `<html><body style="margin:0;background:linear-gradient(135deg,#0b3d91,#f4a261)">` +
	`<h1 style="color:#fff;font:48px sans-serif;padding:40px">Airlock screenshot bench</h1>` +
	`<p style="color:#fff;font:20px serif;padding:0 40px">Lorem ipsum dolor sit amet, consectetur ` +
	`adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.</p></body></html>`

// cdpRoute is one way to the same page target: through the gateway or direct.
type cdpRoute struct {
	name string
	sess *cdpSession
}

// TestBenchBrowserCDP measures, through the gateway of a real `airlock up` and on the
// sandbox's address directly, in the same run and on the same page target: the CDP
// round trip (Runtime.evaluate of 1+1; target p50 gateway/direct ≤ 1.3) and screenshot
// throughput (Page.captureScreenshot at 1280×800; target gateway ≥ 0.9× direct). Then
// browser sandbox create → CDP ready (/json/version answering through the gateway),
// cold and claimed from a warm pool (target pooled p50 ≤ 100 ms). Missed targets are
// printed, never failed.
func TestBenchBrowserCDP(t *testing.T) {
	testenv.NeedBench(t)
	s, c := browserStack(t, "ebpf", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	const suite = "browser"
	img := testenv.BrowserImage()

	sb, err := c.Create(ctx, browserCreate(img, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	gwBase, hdr := cdpEndpoint(ctx, t, c, sb.ID)
	if err := waitCDP(ctx, gwBase, hdr); err != nil {
		t.Fatal(err)
	}
	directBase := "http://" + sandboxAddr(ctx, t, s, sb.ID, opensandbox.CDPPort)
	target := firstPage(ctx, t, gwBase, hdr)
	directWS := "ws://" + strings.TrimPrefix(directBase, "http://") + "/devtools/page/" + target.ID
	routes := []cdpRoute{{name: "direct"}, {name: "gateway"}}
	for i, u := range []struct {
		ws  string
		hdr http.Header
	}{{directWS, nil}, {target.WebSocketDebuggerURL, hdr}} {
		sess, err := dialCDP(ctx, u.ws, u.hdr)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		routes[i].sess = sess
		// The override belongs to the session: both render 1280×800.
		if _, err := cdp.Call(ctx, sess, emulation.SetDeviceMetricsOverride,
			emulation.SetDeviceMetricsOverrideParams{Width: 1280, Height: 800, DeviceScaleFactor: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cdp.Call(ctx, routes[0].sess, page.Navigate,
		page.NavigateParams{URL: "data:text/html," + url.PathEscape(benchPage)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a data: page loads at once; let it paint

	eval := func(r cdpRoute) func() error { return func() error { return evalOnePlusOne(ctx, r.sess) } }
	shot := func(r cdpRoute) func() error {
		return func() error {
			res, err := cdp.Call(ctx, r.sess, page.CaptureScreenshot, page.CaptureScreenshotParams{Format: page.CaptureScreenshotFormatPng, OptimizeForSpeed: new(true)})
			if err == nil && len(res.Data) < 10_000 {
				err = fmt.Errorf("a %d-byte screenshot", len(res.Data))
			}
			return err
		}
	}
	evals := interleaved(t, routes, "cdp_evaluate_", eval, 100, 500, 4)
	shots := interleaved(t, routes, "screenshot_1280x800_", shot, 3, 15, 4)
	for _, smp := range append(evals, shots...) {
		benchreport.Print(suite, smp)
	}
	benchreport.Ratio(suite, "cdp_evaluate_p50_gateway_over_direct",
		float64(evals[1].Quantile(0.5))/float64(evals[0].Quantile(0.5)), "≤", 1.3)
	benchreport.Ratio(suite, "screenshot_rate_gateway_over_direct", shots[1].Rate()/shots[0].Rate(), "≥", 0.9)
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// Create → CDP ready, cold (other limits than the pool's) and pooled.
	const n = 5
	ready := func(name string, limits map[string]string, before func()) benchreport.Sample {
		smp := benchreport.Sample{Name: name}
		for range n {
			before()
			t0 := time.Now()
			sb, err := c.Create(ctx, browserCreate(img, limits))
			if err != nil {
				t.Fatal(err)
			}
			base, hdr := cdpEndpoint(ctx, t, c, sb.ID)
			if err := waitCDP(ctx, base, hdr); err != nil {
				t.Fatal(err)
			}
			d := time.Since(t0)
			smp.Latencies = append(smp.Latencies, d)
			smp.Wall += d
			got, err := c.Get(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if pooled := strings.Contains(got.Status.Message, "warm pool"); pooled != (limits != nil) {
				t.Fatalf("%s: served by the pool: %v (%s)", name, pooled, got.Status.Message)
			}
			if err := c.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		return smp
	}
	cold := ready("create_to_cdp_ready_cold", nil, func() {})
	pooled := ready("create_to_cdp_ready_pooled", browserPoolLimits, func() { waitPoolReady(ctx, t, s) })
	benchreport.Print(suite, cold)
	benchreport.Print(suite, pooled)
	benchreport.Ratio(suite, "create_to_cdp_ready_pooled_p50_ms", float64(pooled.Quantile(0.5))/float64(time.Millisecond), "≤", 100)
	benchreport.Ratio(suite, "create_to_cdp_ready_pooled_over_cold_p50", float64(pooled.Quantile(0.5))/float64(cold.Quantile(0.5)), "≤", 0)
}

// interleaved measures op on each route in rounds of n after warm warm-up calls,
// alternating the order each round, and returns one sample per route named
// prefix+route.
func interleaved(t *testing.T, routes []cdpRoute, prefix string, op func(cdpRoute) func() error, warm, n, rounds int) []benchreport.Sample {
	t.Helper()
	out := make([]benchreport.Sample, len(routes))
	for i, r := range routes {
		out[i].Name = prefix + r.name
		for range warm {
			if err := op(r)(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range rounds {
		for k := range routes {
			i := k
			if round%2 == 1 {
				i = len(routes) - 1 - k
			}
			smp, err := benchreport.Measure(out[i].Name, n, op(routes[i]))
			if err != nil {
				t.Fatal(err)
			}
			out[i].Latencies = append(out[i].Latencies, smp.Latencies...)
			out[i].Wall += smp.Wall
		}
	}
	return out
}
