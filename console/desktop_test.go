package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/png"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sandboximage"
	"github.com/airlockdev/airlock/sdk"
)

// probeTitle is the title of the page the desktop test opens in the sandbox's Chromium;
// the page is magenta (#ff00ff) from edge to edge.
const probeTitle = "airlock-desktop-probe"

// desktopBrowser is browser() with site isolation off, so that the noVNC frame (another
// origin, the gateway's) runs in the page's process and the test can look inside it.
func desktopBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testenv.SkipOrFail(t, "needs Chromium (apt-get install chromium; deploy/host/prepare.sh installs it)")
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-site-isolation-trials", true), chromedp.Flag("disable-features", "IsolateOrigins,site-per-process"),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000))
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel2)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx
}

// magenta counts the pixels of img that are #ff00ff (within a small tolerance).
func magenta(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 > 240 && g>>8 < 16 && bl>>8 > 240 {
				n++
			}
		}
	}
	return n
}

// TestConsoleDesktop: a real desktop sandbox (airlock/desktop) behind a real airlock up;
// the test opens a magenta page titled probeTitle in the sandbox's Chromium; the
// console's sandbox page shows the live desktop (noVNC, connected through the gateway
// under the signed host-form URL the console minted) with that window on its canvas,
// and its Screenshot action returns a PNG of the display showing the window.
func TestConsoleDesktop(t *testing.T) {
	s, _ := startStack(t)
	img := testenv.NeedDesktopImage(t)
	ctx := desktopBrowser(t)
	base := "http://" + s.Addr.String()
	cli, err := sdk.New(sdk.Config{BaseURL: base, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := cli.Create(tctx, sdk.CreateRequest{Image: img, Entrypoint: []string{sandboximage.DesktopEntrypoint}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Kill(context.WithoutCancel(tctx), sb.ID) }()
	x, err := cli.Execd(tctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(tctx); err != nil {
		t.Fatal(err)
	}
	ep, err := cli.Endpoint(tctx, sb.ID, opensandbox.NoVNCPort)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		req, _ := http.NewRequestWithContext(tctx, http.MethodGet, "http://"+ep.Endpoint+"/vnc.html", nil)
		req.Header.Set(lifecycle.AccessTokenHeader, ep.Headers[lifecycle.AccessTokenHeader])
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if i == 600 {
			t.Fatalf("noVNC never answered through the gateway: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The window: a page of the sandbox's own Chromium (the running instance opens it).
	open := `DISPLAY=:0 chromium --no-sandbox --user-data-dir=/tmp/chromium-desktop --new-window ` +
		`'data:text/html,<title>` + probeTitle + `</title><body style="margin:0;background:%23ff00ff"></body>' >/dev/null 2>&1
for i in $(seq 100); do DISPLAY=:0 wmctrl -l | grep -q ` + probeTitle + ` && break; sleep 0.1; done
DISPLAY=:0 wmctrl -l`
	var out strings.Builder
	if _, err := x.Run(tctx, sdk.Command{Command: open}, func(e sdk.Event) error {
		out.WriteString(e.Text)
		return nil
	}); err != nil || !strings.Contains(out.String(), probeTitle+" - Chromium") {
		t.Fatalf("opening the probe window: %v; windows:\n%s", err, out.String())
	}

	id := func(s string) chromedp.ID { return chromedp.ID(s) }
	do(t, ctx, "sign in", 20*time.Second, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(id("key")),
		setVal("key", s.APIKey), chromedp.Click(id("login-submit")), chromedp.WaitVisible(id("create-form")))
	// The page of a desktop sandbox opens its live desktop by itself.
	do(t, ctx, "open the sandbox's page", 30*time.Second, chromedp.Navigate(base+"/console/sandboxes/"+sb.ID),
		chromedp.WaitVisible(id("desktop-view")), waitJS(`document.getElementById('desktop-frame').src.includes('/vnc.html')`))
	src := get(t, ctx, "frame source", chromedp.Evaluate[string](`document.getElementById('desktop-frame').src`))
	if !strings.HasPrefix(src, "http://6080-"+sb.ID+"-") || !strings.Contains(src, ".airlock.localhost:") {
		t.Errorf("the desktop frame loads %s, want the signed host form 6080-<id>-<exp>-<tag>.airlock.localhost", src)
	}
	frames := get(t, ctx, "the desktop frame", chromedp.Nodes(chromedp.ID("desktop-frame")))
	// noVNC connected (its UI marks the document) and its canvas shows the window.
	canvasMagenta := `(() => { const c = document.querySelector('#noVNC_container canvas') || document.querySelector('canvas');
		if (!document.documentElement.classList.contains('noVNC_connected') || !c || !c.width) return 0;
		const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
		for (let i = 0; i < d.length; i += 4) if (d[i] > 240 && d[i+1] < 16 && d[i+2] > 240) n++;
		return n > 20000 ? n : 0; })()`
	pctx, pcancel := context.WithTimeout(ctx, 60*time.Second)
	var n int
	// The frame may still be navigating from its first empty document to noVNC's page
	// when the poll starts: that context goes away under the poll ("destroyed"), or is
	// gone before the poll reaches it ("Cannot find context", a flake seen in CI); the
	// poll then starts again in the new one.
	for try := 0; ; try++ {
		n, err = chromedp.Run(pctx, chromedp.Poll[int](canvasMagenta, chromedp.WithPollingInFrame(frames[0]),
			chromedp.WithPollingInterval(200*time.Millisecond)))
		if err == nil || try == 4 || !strings.Contains(err.Error(), "Execution context was destroyed") &&
			!strings.Contains(err.Error(), "Cannot find context with specified id") {
			break
		}
		time.Sleep(500 * time.Millisecond)
		frames = get(t, ctx, "the desktop frame", chromedp.Nodes(chromedp.ID("desktop-frame")))
	}
	pcancel()
	if err != nil {
		shot(t, ctx, "desktop-01-no-canvas")
		failAt(t, ctx, "noVNC's canvas with the probe window", err)
	}
	t.Logf("noVNC canvas: %d magenta pixels", n)
	shot(t, ctx, "desktop-01-live")

	// The screenshot action: a PNG of the display, with the window on it.
	do(t, ctx, "take a screenshot", 40*time.Second, chromedp.Click(id("desktop-shot")), chromedp.WaitVisible(id("desktop-shot-out")))
	dataURL := get(t, ctx, "screenshot", chromedp.Evaluate[string](`document.getElementById('desktop-shot-img').src`))
	b64, ok := strings.CutPrefix(dataURL, "data:image/png;base64,")
	raw, err := base64.StdEncoding.DecodeString(b64)
	if !ok || err != nil {
		t.Fatalf("screenshot is not a PNG data URL: %.80s (%v)", dataURL, err)
	}
	pic, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := pic.Bounds(); b.Dx() != 1280 || b.Dy() != 800 {
		t.Errorf("screenshot is %v, want the 1280×800 display", b)
	}
	if m := magenta(pic); m < 20000 {
		t.Errorf("the screenshot has %d magenta pixels: the probe window is not on it", m)
	} else {
		t.Logf("screenshot: %d magenta pixels of %d", m, pic.Bounds().Dx()*pic.Bounds().Dy())
	}
	shot(t, ctx, "desktop-02-screenshot")
}
