package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/airlockdev/airlock/console"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
	"github.com/airlockdev/airlock/stack"
)

const testNetwork = "altest-con0"

func TestMain(m *testing.M) {
	code := m.Run()
	lctest.RemoveNetwork(testNetwork)
	os.Exit(code)
}

// browser starts Debian's headless Chromium (a fresh profile, no background
// networking: the machine has no route to Google) and returns a chromedp context.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testenv.SkipOrFail(t, "needs Chromium (apt-get install chromium; deploy/host/prepare.sh installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel2)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx
}

// artifacts is where screenshots go: $AIRLOCK_ARTIFACTS_DIR/console, else
// bin/artifacts/console under the module root.
func artifacts(t *testing.T) string {
	dir := filepath.Join(lctest.ModuleRoot(t), "bin", "artifacts", "console")
	if d := os.Getenv("AIRLOCK_ARTIFACTS_DIR"); d != "" {
		dir = filepath.Join(d, "console")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shot writes a full-page screenshot (PNG) of the current page.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	buf, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	p := filepath.Join(artifacts(t), name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Error(err)
		return
	}
	t.Logf("screenshot: %s", p)
}

// do runs steps with a deadline, failing the test with what was being done and where.
func do(t *testing.T, ctx context.Context, what string, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		failAt(t, ctx, what, err)
	}
}

// get runs one action that returns a value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		failAt(t, ctx, what, err)
	}
	return v
}

func failAt(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(c, chromedp.Location())
	body, _ := chromedp.Run(c, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
	t.Fatalf("%s: %v (at %s; page: %.800s)", what, err, loc, body)
}

// waitJS polls a JavaScript expression until it is truthy.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[bool]("!!("+expr+")", chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(0))(ctx, tg)
		return chromedp.Void{}, err
	}
}

// setVal sets a form control's value through the DOM and fires input and change, as
// typing and choosing do.
func setVal(id, value string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		js := fmt.Sprintf(`(() => { const e = document.getElementById(%q); if (!e) return false; e.value = %q;
			e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true})); return true })()`, id, value)
		ok, err := chromedp.Evaluate[bool](js)(ctx, tg)
		if err == nil && !ok {
			err = fmt.Errorf("no element #%s", id)
		}
		return chromedp.Void{}, err
	}
}

// jsFetch evaluates a promise in the page.
func jsFetch[T any](expr string) chromedp.Action[T] {
	return chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise)
}

// startStack runs the whole of airlock up in this process: egressd in eBPF mode on a
// pin root of the test's own, a loopback DNS upstream where allowed.test and
// denied.test exist, its own Docker network and container names.
func startStack(t *testing.T) (*stack.Stack, string) {
	img := testenv.NeedSandboxImage(t)
	testenv.NeedBPF(t)
	var b [4]byte
	rand.Read(b[:])
	pin := filepath.Join("/sys/fs/bpf", "airlock-contest-"+hex.EncodeToString(b[:]))
	t.Cleanup(func() { os.RemoveAll(pin) })
	resolver := dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{
		"allowed.test.": netip.MustParseAddr("203.0.113.10"), "denied.test.": netip.MustParseAddr("203.0.113.20"),
	}, 60))
	// The policy library: one named policy, deny all but allowed.test.
	lib := t.TempDir()
	if err := os.WriteFile(filepath.Join(lib, "allowed-only.yaml"),
		[]byte("defaultAction: deny\negress:\n  - action: allow\n    target: allowed.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := stack.New(stack.Config{
		Listen: "127.0.0.1:0", StateDir: t.TempDir(), Policies: stack.PoliciesConfig{Dir: lib},
		Gateway: stack.GatewayConfig{Listen: "127.0.0.1:0"},
		Egress:  stack.EgressdConfig{Mode: "ebpf", PinRoot: pin, NFTTable: nfttest.Table(t), Upstreams: []string{resolver}},
		Docker:  stack.DockerConfig{Network: testNetwork, ExecdPath: lctest.Execd(t), NamePrefix: lctest.NamePrefix},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lctest.RemoveAll(t, s.Docker)
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s, img
}

// TestConsoleInBrowser drives the console of a real airlock up in headless Chromium:
// wrong key, sign-in, create a sandbox under the named policy allowed-only (deny all
// but allowed.test) from the library, see it
// Running, its page with the live audit stream (a denied DNS query from inside it shows
// within 2 s), explain, a signed URL opened in the browser, CSRF attempts refused with
// nothing changed, the audit page (verification, charts, search, export), delete.
func TestConsoleInBrowser(t *testing.T) {
	s, img := startStack(t)
	ctx := browser(t)
	base := "http://" + s.Addr.String()
	cli, err := sdk.New(sdk.Config{BaseURL: base, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	id := func(s string) chromedp.ID { return chromedp.ID(s) }
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	// Signed out: the console sends the browser to the login page; a wrong key is
	// refused with the page saying so.
	do(t, ctx, "open the console", 20*time.Second, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(id("key")))
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasPrefix(loc, base+"/console/login?next=") {
		t.Fatalf("signed out, /console/ led to %s", loc)
	}
	do(t, ctx, "sign in with a wrong key", 20*time.Second,
		chromedp.SendKeys(id("key"), "ak_wrong"),
		chromedp.Click(id("login-submit")),
		chromedp.WaitVisible(id("login-error")))
	if msg := get(t, ctx, "login error", chromedp.Text(id("login-error"))); !strings.Contains(msg, "Wrong API key") {
		t.Errorf("wrong key message %q", msg)
	}
	shot(t, ctx, "01-login-wrong-key")

	// Sign in.
	do(t, ctx, "sign in", 20*time.Second,
		setVal("key", s.APIKey),
		chromedp.Click(id("login-submit")),
		chromedp.WaitVisible(id("create-form")))
	if loc := get(t, ctx, "location", chromedp.Location()); loc != base+"/console/" {
		t.Errorf("after sign-in at %s", loc)
	}
	// The page's HTML as the page has it now, in one evaluation: a node id taken for
	// OuterHTML can be gone by the time it is read while the console renders.
	if html := get(t, ctx, "page", chromedp.Evaluate[string](`document.documentElement.outerHTML`)); strings.Contains(html, s.APIKey) {
		t.Fatal("the API key is in the page")
	}

	// A failing action shows the API's error in the page: an invalid policy.
	do(t, ctx, "create with an invalid policy", 20*time.Second,
		setVal("c-image", img),
		setVal("c-policy", "__json__"),
		setVal("c-netpol", `{"defaultAction":"maybe","egress":[]}`),
		chromedp.Click(id("create-submit")),
		waitJS(`document.getElementById('create-msg').classList.contains('error')`))
	if m := get(t, ctx, "create error", chromedp.Text(id("create-msg"))); !strings.Contains(m, "Create failed") || !strings.Contains(m, "INVALID_REQUEST") {
		t.Errorf("invalid policy: the page says %q, want the API's INVALID_REQUEST message", m)
	}

	// Create under the named policy allowed-only (deny all but allowed.test).
	do(t, ctx, "create a sandbox", 60*time.Second,
		setVal("c-image", img),
		waitJS(`[...document.getElementById('c-policy').options].some(o => o.value === 'name:allowed-only')`),
		setVal("c-policy", "name:allowed-only"),
		chromedp.Click(id("create-submit")),
		waitJS(`(document.getElementById('create-msg').textContent || '').startsWith('Created ')`))
	msg := get(t, ctx, "create message", chromedp.Text(id("create-msg")))
	sbID := strings.Fields(strings.TrimPrefix(msg, "Created "))[0]
	t.Logf("created %s", sbID)
	row := fmt.Sprintf(`tr[data-id=%q]`, sbID)
	do(t, ctx, "see it Running in the list", 90*time.Second,
		waitJS(fmt.Sprintf(`document.querySelector('%s td.state')?.textContent === 'Running'`, row)))
	if policy := get(t, ctx, "policy column", chromedp.Text(css(row+" td.policy"))); !strings.Contains(policy, "allowed-only v") {
		t.Errorf("policy column %q, want the named policy and its version", policy)
	}
	shot(t, ctx, "02-sandboxes")

	// Its page: the live stream connects; the policy is a table of rules.
	do(t, ctx, "open the sandbox page", 30*time.Second,
		chromedp.Click(css(row+" td a")),
		chromedp.WaitVisible(id("stream")),
		waitJS(`document.getElementById('stream-status').dataset.live === '1'`),
		waitJS(`document.querySelectorAll('#policy-rules tbody tr').length === 1`))
	if rules := get(t, ctx, "policy rules", chromedp.Text(css("#policy-rules tbody"))); !strings.Contains(rules, "allowed.test") || !strings.Contains(rules, "allow") {
		t.Errorf("policy rules %q", rules)
	}

	// A denied DNS query from inside the sandbox appears in the stream within 2 s.
	x, err := cli.Execd(tctx, sbID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(tctx); err != nil {
		t.Fatal(err)
	}
	ex, err := x.Run(tctx, sdk.Command{Command: "getent hosts denied.test; echo rc=$?"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if strings.Contains(strings.Join(ex.Stdout, "\n"), "203.0.113.20") {
		t.Fatalf("denied.test resolved in the sandbox: %q", ex.Stdout)
	}
	do(t, ctx, "see the denial in the live stream", 5*time.Second,
		waitJS(`[...document.querySelectorAll('#stream tbody tr[data-action="deny"][data-source="dns"] td.dst')].some(td => td.textContent.startsWith('denied.test'))`))
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("the denied query reached the live stream after %s, want within 2 s", d)
	} else {
		t.Logf("the denied query was in the live stream %s after the command returned", d.Round(time.Millisecond))
	}
	// The timeline: the command, followed by the DNS query it made (linked by time).
	do(t, ctx, "see the command and its DNS query in the timeline", 15*time.Second,
		waitJS(`(document.getElementById('timeline-refresh').click(), [...document.querySelectorAll('#timeline li.timeline-command')].some(li =>
			li.textContent.includes('getent hosts denied.test') && [...li.querySelectorAll('ul li.rec-deny')].some(f => f.textContent.includes('denied.test'))))`))
	// Filters (server side): allow-only drops it, deny + host brings it back.
	do(t, ctx, "filter the stream", 30*time.Second,
		setVal("f-action", "allow"),
		chromedp.Click(css(`#stream-filter button[type="submit"]`)),
		waitJS(`document.getElementById('stream-status').dataset.live === '1'`),
		waitJS(`document.querySelectorAll('#stream tbody tr[data-action="deny"]').length === 0`),
		setVal("f-action", "deny"),
		setVal("f-host", "denied"),
		chromedp.Click(css(`#stream-filter button[type="submit"]`)),
		waitJS(`document.getElementById('stream-status').dataset.live === '1'`),
		waitJS(`document.querySelectorAll('#stream tbody tr[data-action="deny"]').length > 0`))

	// Explain against the sandbox's policy.
	do(t, ctx, "explain denied.test", 10*time.Second,
		setVal("ex-target", "denied.test"),
		chromedp.Click(id("ex-submit")),
		chromedp.WaitVisible(id("explain-decision")))
	if d := get(t, ctx, "decision", chromedp.Text(id("explain-decision"))); !strings.Contains(d, "deny") {
		t.Errorf("explain denied.test: %q", d)
	}
	do(t, ctx, "explain allowed.test", 10*time.Second,
		setVal("ex-target", "allowed.test"),
		chromedp.Click(id("ex-submit")),
		waitJS(`document.getElementById('explain-decision')?.textContent.includes('allowed.test')`))
	if d := get(t, ctx, "decision", chromedp.Text(id("explain-decision"))); !strings.Contains(d, "allow") {
		t.Errorf("explain allowed.test: %q", d)
	}

	// Mint a signed URL for execd: the console shows it to copy, never as a link the
	// browser could open (nor are the execd and egress API routes links); the copied URL
	// works from a client (/ping 200). A user port's signed URL is a link.
	do(t, ctx, "mint a signed URL", 10*time.Second,
		setVal("sign-port", "44772"),
		setVal("sign-minutes", "30"),
		chromedp.Click(id("sign-submit")),
		chromedp.WaitVisible(css("#signed-url code")))
	signed := get(t, ctx, "signed URL", chromedp.Text(css("#signed-url code")))
	if !strings.HasPrefix(signed, "http://"+s.Gateway.Addr()+"/"+sbID+"/44772/") {
		t.Errorf("signed URL %q", signed)
	}
	links := get(t, ctx, "links to control ports", jsFetch[[]string](
		`[...document.querySelectorAll('#sign-out a, #routes tr[data-port="44772"] a, #routes tr[data-port="18080"] a')].map(a => a.href)`))
	if len(links) != 0 {
		t.Errorf("the console links control-port URLs %q, want copy only", links)
	}
	shot(t, ctx, "03-sandbox")
	if resp, err := http.Get(strings.TrimSuffix(signed, "/") + "/ping"); err != nil {
		t.Errorf("GET %s/ping: %v", signed, err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s/ping: %d, want 200", signed, resp.StatusCode)
	}
	do(t, ctx, "mint a signed URL for a user port", 10*time.Second,
		setVal("sign-port", "8080"),
		chromedp.Click(id("sign-submit")),
		chromedp.WaitVisible(css("#signed-url a")))
	if href := get(t, ctx, "signed user-port URL", chromedp.AttributeValue(css("#signed-url a"), "href")).Value; !strings.Contains(href, sbID) {
		t.Errorf("signed user-port link %q", href)
	}

	// Revoke: the button bumps the sandbox's signed-URL epoch; the gateway refuses the
	// URL minted before (401) within the watch latency.
	do(t, ctx, "revoke the signed URLs", 20*time.Second,
		chromedp.Navigate(base+"/console/sandboxes/"+sbID), chromedp.WaitVisible(id("sign-revoke")),
		chromedp.Click(id("sign-revoke")),
		waitJS(`document.getElementById('sign-msg')?.textContent.includes('revoked')`))
	for deadline := time.Now().Add(5 * time.Second); ; {
		st := 0
		if r, err := http.Get(strings.TrimSuffix(signed, "/") + "/ping"); err == nil {
			st = r.StatusCode
			r.Body.Close()
		}
		if st == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked signed URL still answers %d, want 401", st)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// CSRF: a write without the token from the console's own page, the classic
	// cross-origin form post, and a foreign Origin with a valid session and token are
	// all refused, and the sandbox stays Running.
	do(t, ctx, "back to the sandbox page", 20*time.Second,
		chromedp.Navigate(base+"/console/sandboxes/"+sbID), chromedp.WaitVisible(id("stream")))
	status := get(t, ctx, "a write without the CSRF token",
		jsFetch[int](fmt.Sprintf(`fetch('/console/api/v1/sandboxes/%s/pause', {method: 'POST'}).then(r => r.status)`, sbID)))
	code := get(t, ctx, "a delete without the CSRF token",
		jsFetch[string](fmt.Sprintf(`fetch('/console/api/v1/sandboxes/%s', {method: 'DELETE'}).then(r => r.json()).then(j => j.code)`, sbID)))
	if status != 403 || code != "CSRF_FAILED" {
		t.Errorf("writes without the token: %d %s, want 403 CSRF_FAILED", status, code)
	}
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id=f method=post action="%s/console/api/v1/sandboxes/%s/pause"></form>
<script>document.getElementById('f').submit()</script>`, base, sbID)
	}))
	defer evil.Close()
	do(t, ctx, "a cross-origin form post", 20*time.Second,
		chromedp.Navigate(evil.URL), waitJS(`location.href.includes('/console/api/v1/')`))
	if body := get(t, ctx, "answer", chromedp.Text(css("body"))); !strings.Contains(body, "CSRF_FAILED") {
		t.Errorf("cross-origin form post answered %q", body)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	lreq, _ := http.NewRequest("POST", base+"/console/login", strings.NewReader(url.Values{"key": {s.APIKey}}.Encode()))
	lreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	lreq.Header.Set("Origin", base)
	lresp, err := hc.Do(lreq)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(lresp.Body)
	lresp.Body.Close()
	_, rest, _ := strings.Cut(string(page), `name="csrf-token" content="`)
	token, _, _ := strings.Cut(rest, `"`)
	if token == "" {
		t.Fatalf("no CSRF token after a Go sign-in (%d)", lresp.StatusCode)
	}
	for _, origin := range []string{"http://evil.example", evil.URL} {
		req, _ := http.NewRequest("POST", base+"/console/api/v1/sandboxes/"+sbID+"/pause", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set(console.CSRFHeader, token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "CSRF_FAILED") {
			t.Errorf("foreign Origin %s: %d %s", origin, resp.StatusCode, b)
		}
	}
	if sb, err := cli.Get(tctx, sbID); err != nil || sb.Status.State != "Running" {
		t.Fatalf("after the CSRF attempts: %+v %v, want Running", sb, err)
	}

	// The audit page: the chain verifies, the charts have this sandbox, search finds
	// the denial, export gives JSON Lines.
	do(t, ctx, "the audit page", 30*time.Second,
		chromedp.Navigate(base+"/console/audit"),
		waitJS(`document.getElementById('verify-status').dataset.ok === 'true'`),
		waitJS(fmt.Sprintf(`document.querySelector('figure.minute-chart[data-sandbox=%q] svg rect.deny')`, sbID)),
		waitJS(`[...document.querySelectorAll('#top-denied svg text')].some(e => e.textContent === 'denied.test')`),
		setVal("s-sandbox", sbID),
		setVal("s-action", "deny"),
		chromedp.Click(id("search-submit")),
		waitJS(`[...document.querySelectorAll('#results tbody tr')].some(tr => tr.textContent.includes('denied.test'))`))
	if v := get(t, ctx, "verification", chromedp.Text(id("verify-status"))); !strings.HasPrefix(v, "Chain verified") {
		t.Errorf("verification %q", v)
	}
	shot(t, ctx, "04-audit")
	export := get(t, ctx, "export JSON Lines",
		jsFetch[string](fmt.Sprintf(`fetch('/console/api/audit/export?sandbox=%s').then(r => r.text())`, sbID)))
	if !strings.Contains(export, `"dst_host":"denied.test"`) {
		t.Errorf("export: %.300q", export)
	}
	// The console's own writes (create, mint a signed URL, the refused CSRF attempts
	// never reached the API) are control-plane records of the signed-in admin, shown in
	// the audit page's search.
	do(t, ctx, "control-plane records in the search", 20*time.Second,
		setVal("s-action", ""),
		setVal("s-source", "control"),
		chromedp.Click(id("search-submit")),
		waitJS(`[...document.querySelectorAll('#results tbody tr')].some(tr => tr.textContent.includes('sandbox.create') && tr.textContent.includes('by admin'))`),
		waitJS(`[...document.querySelectorAll('#results tbody tr')].some(tr => tr.textContent.includes('signed_url.mint'))`))
	for _, l := range strings.Split(strings.TrimSpace(export), "\n") {
		if !strings.HasPrefix(l, "{") || !strings.Contains(l, `"sandbox_id":"`+sbID+`"`) || !strings.Contains(l, `"hash":"`) {
			t.Errorf("export line %q", l)
		}
	}

	// The platform floor in the explain view, then the sandbox's pending proposal (its
	// refused denied.test): approved in the browser, it is applied to the sandbox
	// (the policy table shows the new rule and denied.test now resolves inside).
	do(t, ctx, "explain the metadata address and see the proposal", 30*time.Second,
		chromedp.Navigate(base+"/console/sandboxes/"+sbID),
		chromedp.WaitVisible(id("explain-form")),
		setVal("ex-target", "169.254.169.254"),
		chromedp.Click(id("ex-submit")),
		chromedp.WaitVisible(id("explain-floor")),
		waitJS(`(document.getElementById('proposal-status')?.textContent || '').startsWith('Pending')`),
		waitJS(`!document.getElementById('proposal-approve').disabled`))
	if f := get(t, ctx, "floor", chromedp.Text(id("explain-floor"))); !strings.Contains(f, "platform floor") {
		t.Errorf("explain of 169.254.169.254: floor %q", f)
	}
	if y := get(t, ctx, "proposal", chromedp.Text(id("proposal-out"))); !strings.Contains(y, "denied.test") {
		t.Errorf("the proposal does not name denied.test: %q", y)
	}
	shot(t, ctx, "04b-proposal")
	// Approved with a "save as" name: written into the policy library, which serves it,
	// and the sandbox runs under it.
	do(t, ctx, "approve the proposal into the library", 20*time.Second,
		setVal("proposal-save-as", "learned-in-console"),
		chromedp.Click(id("proposal-approve")))
	c2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	_, werr := chromedp.Run(c2, waitJS(`document.getElementById('proposal-msg')?.textContent`))
	cancel2()
	if werr != nil {
		state := get(t, ctx, "proposal state", jsFetch[string](`(async () => {
		  const b = document.getElementById('proposal-approve');
		  const r = await fetch(location.pathname.replace('/console/sandboxes/', '/console/api/v1/sandboxes/') + '/policy/proposal');
		  return 'disabled=' + b.disabled + ' msg=' + document.getElementById('proposal-msg').textContent + ' GET=' + r.status + ' ' + (await r.text()).slice(0, 300);
		})()`))
		t.Fatalf("no message after Approve: %s", state)
	}
	if m := get(t, ctx, "approval message", chromedp.Text(id("proposal-msg"))); !strings.HasPrefix(m, "Approved: saved in the policy library as learned-in-console") {
		t.Fatalf("after Approve the page says %q", m)
	}
	do(t, ctx, "see the approved policy", 20*time.Second,
		waitJS(`[...document.querySelectorAll('#policy-rules tbody tr')].some(tr => tr.textContent.includes('denied.test'))`),
		waitJS(`document.body.textContent.includes('named policy learned-in-console')`),
		waitJS(`(document.getElementById('proposal-last')?.textContent || '').includes('saved as library policy learned-in-console')`))
	if b, err := os.ReadFile(filepath.Join(s.Library.Dir(), "learned-in-console.yaml")); err != nil || !strings.Contains(string(b), "target: denied.test") {
		t.Errorf("the library file of the approval (%v):\n%s", err, b)
	}
	if np, ok := s.Library.Get("learned-in-console"); !ok || np.Version != 1 {
		t.Errorf("the library does not serve learned-in-console: %+v", np)
	}
	ex, err = x.Run(tctx, sdk.Command{Command: "getent hosts denied.test"}, nil)
	if err != nil || !strings.Contains(strings.Join(ex.Stdout, "\n"), "203.0.113.20") {
		t.Errorf("after the approval denied.test does not resolve in the sandbox: %v %q", err, ex.Stdout)
	}

	// Delete from the list (two clicks: arm, confirm) and see it gone.
	do(t, ctx, "delete the sandbox", 60*time.Second,
		chromedp.Navigate(base+"/console/"),
		chromedp.WaitVisible(css(row)),
		chromedp.Click(css(row+` button[data-action="delete"]`)),
		chromedp.Click(css(row+` button[data-action="delete"]`)),
		waitJS(fmt.Sprintf(`!document.querySelector('%s')`, row)))
	if msg := get(t, ctx, "list message", chromedp.Text(id("list-msg"))); !strings.Contains(msg, sbID+" deleted") {
		t.Errorf("after delete: %q", msg)
	}
	if _, err := cli.Get(tctx, sbID); err == nil {
		t.Error("the sandbox is still there after the console deleted it")
	}
	shot(t, ctx, "05-sandboxes-after-delete")
}

// TestConsoleSessionExpiry: with a short session lifetime (Config.SessionTTL), a
// signed-in browser is sent back to the login page, which says the session expired.
func TestConsoleSessionExpiry(t *testing.T) {
	ctx := browser(t)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"items":[],"pagination":{"totalItems":0}}`)
	})
	con, err := console.New(console.Config{API: api, APIKey: "ak_expiry", SessionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	do(t, ctx, "sign in", 20*time.Second,
		chromedp.Navigate(srv.URL+"/console/audit"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SendKeys(chromedp.ID("key"), "ak_expiry"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("search-form")))
	time.Sleep(2100 * time.Millisecond)
	do(t, ctx, "reload after expiry", 20*time.Second,
		chromedp.Navigate(srv.URL+"/console/"),
		chromedp.WaitVisible(chromedp.ID("login-notice")))
	notice := get(t, ctx, "notice", chromedp.Text(chromedp.ID("login-notice")))
	loc := get(t, ctx, "location", chromedp.Location())
	if !strings.Contains(notice, "expired") || !strings.Contains(loc, "expired=1") {
		t.Errorf("after expiry: %s %q", loc, notice)
	}
	shot(t, ctx, "06-login-session-expired")
}
