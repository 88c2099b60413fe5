package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/airlockdev/airlock/console"
	"github.com/airlockdev/airlock/sdk"
)

// TestConsoleTerminal drives the sandbox page's terminal in headless Chromium against a
// real airlock up: open it, type a command, read its output in the page (xterm.js's
// rows); a WebSocket of the console from a foreign Origin, or without the session
// cookie, is refused; the PTY's open, attach and close are in the audit log, through
// the server proxy, as the signed-in principal; the API key is never in the page.
func TestConsoleTerminal(t *testing.T) {
	s, img := startStack(t)
	ctx := browser(t)
	base := "http://" + s.Addr.String()
	cli, err := sdk.New(sdk.Config{BaseURL: base, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := cli.Create(tctx, sdk.CreateRequest{Image: img, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	x, err := cli.Execd(tctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(tctx); err != nil {
		t.Fatal(err)
	}
	id := func(s string) chromedp.ID { return chromedp.ID(s) }

	do(t, ctx, "sign in", 20*time.Second,
		chromedp.Navigate(base+"/console/login"),
		chromedp.WaitVisible(id("key")),
		setVal("key", s.APIKey),
		chromedp.Click(id("login-submit")),
		chromedp.WaitVisible(id("create-form")))
	do(t, ctx, "open the terminal", 30*time.Second,
		chromedp.Navigate(base+"/console/sandboxes/"+sb.ID),
		chromedp.WaitVisible(id("term-open")),
		chromedp.Click(id("term-open")),
		waitJS(`document.getElementById('term-status').dataset.live !== undefined`),
		waitJS(`document.querySelector('#terminal .xterm-rows')?.textContent.includes('#')`)) // the prompt
	// Typed as keys into xterm.js's input; the output (42) differs from the echoed
	// line ($((6*7))), so only the shell's answer matches.
	do(t, ctx, "type a command", 20*time.Second,
		chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")),
		typeKeys("echo term-$((6*7))-ok\r"),
		waitJS(`document.querySelector('#terminal .xterm-rows').textContent.includes('term-42-ok')`))
	// xterm.js's theme applies under the console's strict CSP (its <style> elements
	// are mirrored into constructed style sheets): white on black, not the page's ink.
	if fg := get(t, ctx, "terminal colour", chromedp.Evaluate[string](`getComputedStyle(document.querySelector('#terminal .xterm-rows')).color`)); fg != "rgb(255, 255, 255)" {
		t.Errorf("the terminal's text is %s, want xterm.js's theme foreground rgb(255, 255, 255)", fg)
	}
	rows := get(t, ctx, "terminal rows", chromedp.Evaluate[string](`document.querySelector('#terminal .xterm-rows').textContent`))
	t.Logf("terminal shows: %q", strings.Join(strings.Fields(rows), " "))
	shot(t, ctx, "10-terminal")
	if html := get(t, ctx, "page", chromedp.OuterHTML(chromedp.CSS("html"))); strings.Contains(html, s.APIKey) {
		t.Fatal("the API key is in the page")
	}

	// The console's WebSocket admits only its own origin and a session.
	sid := get(t, ctx, "a second PTY session", jsFetch[string](fmt.Sprintf(`fetch('/console/api/sandboxes/%s/pty', {method: 'POST',
		headers: {'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content, 'Content-Type': 'application/json'}, body: '{}'})
		.then(r => r.json()).then(j => j.session_id)`, sb.ID)))
	if sid == "" {
		t.Fatal("POST /console/api/sandboxes/{id}/pty gave no session_id")
	}
	cookie := signIn(t, base, s.APIKey) // a session of its own, outside the browser
	wsURL := "ws://" + s.Addr.String() + "/console/api/sandboxes/" + sb.ID + "/pty/" + sid + "/ws"
	dial := func(hdr http.Header) int {
		c, resp, err := websocket.Dial(tctx, wsURL, &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil {
			c.CloseNow()
			return http.StatusSwitchingProtocols
		}
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		return resp.StatusCode
	}
	if st := dial(http.Header{"Cookie": {console.CookieName + "=" + cookie}, "Origin": {"http://evil.example"}}); st != http.StatusForbidden {
		t.Errorf("a foreign Origin got %d, want 403", st)
	}
	if st := dial(http.Header{"Cookie": {console.CookieName + "=" + cookie}}); st != http.StatusForbidden {
		t.Errorf("no Origin got %d, want 403", st)
	}
	if st := dial(http.Header{"Origin": {base}}); st != http.StatusUnauthorized {
		t.Errorf("no session got %d, want 401", st)
	}
	if st := dial(http.Header{"Cookie": {console.CookieName + "=" + cookie}, "Origin": {base}}); st != http.StatusSwitchingProtocols {
		t.Errorf("the console's own origin with its session got %d, want 101", st)
	}

	// Close the page's terminal: its session is deleted.
	do(t, ctx, "close the terminal", 20*time.Second,
		chromedp.Click(id("term-close")),
		waitJS(`document.getElementById('term-status').textContent === 'closed'`),
		waitJS(`!document.getElementById('term-open').hidden`))

	// The audit log: pty.open, pty.attach and pty.close through the server proxy, as
	// the admin principal.
	want := map[string]bool{"pty.open": false, "pty.attach": false, "pty.close": false}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ops := get(t, ctx, "audit records", jsFetch[[]string](fmt.Sprintf(`fetch('/console/api/audit?sandbox=%s&source=execd&limit=500')
			.then(r => r.json()).then(j => (j.records || []).filter(r => r.extra && r.extra.entry === 'server_proxy' && r.extra.principal)
			.map(r => r.extra.op))`, sb.ID)))
		for _, op := range ops {
			if _, ok := want[op]; ok {
				want[op] = true
			}
		}
		if want["pty.open"] && want["pty.attach"] && want["pty.close"] {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for op, seen := range want {
		if !seen {
			t.Errorf("no %s record through the server proxy with a principal", op)
		}
	}
	if err := cli.Kill(tctx, sb.ID); err != nil {
		t.Error(err)
	}
}

// typeKeys types s as a user does (CDP Input.dispatchKeyEvent: keyDown with the text,
// then keyUp, per character; \r is Enter), into the focused element.
func typeKeys(s string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		for _, r := range s {
			down := map[string]any{"type": "keyDown", "key": string(r), "text": string(r), "unmodifiedText": string(r)}
			if r == '\r' {
				down = map[string]any{"type": "keyDown", "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}
			}
			if err := tg.Call(ctx, "Input.dispatchKeyEvent", down, nil); err != nil {
				return chromedp.Void{}, err
			}
			up := map[string]any{"type": "keyUp", "key": down["key"]}
			if err := tg.Call(ctx, "Input.dispatchKeyEvent", up, nil); err != nil {
				return chromedp.Void{}, err
			}
		}
		return chromedp.Void{}, nil
	}
}

// signIn signs in to the console at base with key, as the login form does, and returns
// the session cookie's value.
func signIn(t *testing.T, base, key string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/console/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == console.CookieName {
			return c.Value
		}
	}
	t.Fatalf("sign-in answered %d without a session cookie", resp.StatusCode)
	return ""
}
