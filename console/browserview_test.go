package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// TestConsoleBrowserView: a browser sandbox's console page lists the pages its
// Chromium has open (DevTools' /json/list, read by the console server with the
// sandbox's credential) with their hosts, next to the live egress stream that shows the
// same host denied. The console API answers 401 without a session.
func TestConsoleBrowserView(t *testing.T) {
	s, _ := startStack(t)
	bimg := testenv.NeedBrowserImage(t)
	base := "http://" + s.Addr.String()
	cli, err := sdk.New(sdk.Config{BaseURL: base, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := cli.Create(tctx, sdk.CreateRequest{Image: bimg, Entrypoint: []string{"/opt/airlock/browser.sh"},
		NetworkPolicy: json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Kill(context.Background(), sb.ID)
	ep, err := cli.Endpoint(tctx, sb.ID, opensandbox.CDPPort)
	if err != nil {
		t.Fatal(err)
	}
	// Open a page on a denied name through the gateway (DevTools' /json/new takes PUT).
	devtools := func(method, path string) int {
		req, _ := http.NewRequestWithContext(tctx, method, "http://"+ep.Endpoint+path, nil)
		for k, v := range ep.Headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; devtools(http.MethodGet, "/json/version") != http.StatusOK; i++ {
		if i == 600 {
			t.Fatal("DevTools never answered through the gateway")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := devtools(http.MethodPut, "/json/new?http://denied.test/page"); st != http.StatusOK {
		t.Fatalf("PUT /json/new: %d", st)
	}
	if resp, err := http.Get(base + "/console/api/sandboxes/" + sb.ID + "/browser"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the browser view without a session: %v %v, want 401", resp, err)
	}

	ctx := browser(t)
	id := func(s string) chromedp.ID { return chromedp.ID(s) }
	do(t, ctx, "sign in", 20*time.Second,
		chromedp.Navigate(base+"/console/login"),
		chromedp.WaitVisible(id("key")),
		setVal("key", s.APIKey),
		chromedp.Click(id("login-submit")),
		chromedp.WaitVisible(id("create-form")))
	do(t, ctx, "the browser sandbox's page lists its open page with its host", 30*time.Second,
		chromedp.Navigate(base+"/console/sandboxes/"+sb.ID),
		chromedp.WaitVisible(id("browser-card")),
		waitJS(`document.querySelector('#browser-pages tr[data-host="denied.test"]')`))
	do(t, ctx, "the live egress stream shows the same host denied", 30*time.Second,
		waitJS(`[...document.querySelectorAll('#stream tbody tr')].some(r => r.textContent.includes('denied.test') && r.textContent.includes('deny'))`))
	if hosts := get(t, ctx, "hosts", chromedp.Text(id("browser-hosts"))); hosts != "Hosts: denied.test." {
		t.Errorf("hosts line %q", hosts)
	}
	row := get(t, ctx, "page row", chromedp.Text(chromedp.CSS(`#browser-pages tr[data-host="denied.test"]`)))
	t.Logf("page row: %s", row)
	if want := "http://denied.test/page"; !strings.Contains(row, want) {
		t.Errorf("page row %q without %s", row, want)
	}
	shot(t, ctx, "10-browser-sandbox")
}
