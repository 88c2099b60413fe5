package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/coder/websocket"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// cdpSession is a cdp.Session over one WebSocket to a DevTools target, so the tests
// call the protocol with cdproto's typed commands (cdp.Call(ctx, s, runtime.Evaluate,
// ...)) instead of hand-written messages. One call at a time: events that arrive
// between a command and its answer are dropped (Subscribe is not supported).
type cdpSession struct {
	mu   sync.Mutex
	ws   *websocket.Conn
	next int64
}

var _ cdp.Session = (*cdpSession)(nil)

// dialCDP opens a WebSocket to wsURL (a target's webSocketDebuggerUrl) with hdr (the
// sandbox's credential through the gateway, nothing on the sandbox's address).
func dialCDP(ctx context.Context, wsURL string, hdr http.Header) (*cdpSession, error) {
	ws, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("cdp: dial %s: %s: %w", wsURL, resp.Status, err)
		}
		return nil, fmt.Errorf("cdp: dial %s: %w", wsURL, err)
	}
	ws.SetReadLimit(64 << 20) // screenshots of 1280×800 are a few MB in base64
	return &cdpSession{ws: ws}, nil
}

// Call sends method with params and decodes the answer's result into result.
func (s *cdpSession) Call(ctx context.Context, method string, params, result any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	p, err := jsonv2.Marshal(params)
	if err != nil {
		return err
	}
	msg, err := jsonv2.Marshal(cdproto.Message{ID: s.next, Method: cdproto.MethodType(method), Params: p})
	if err != nil {
		return err
	}
	if err := s.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		return fmt.Errorf("cdp: %s: %w", method, err)
	}
	for {
		_, data, err := s.ws.Read(ctx)
		if err != nil {
			return fmt.Errorf("cdp: %s: %w", method, err)
		}
		var in cdproto.Message
		if err := jsonv2.Unmarshal(data, &in); err != nil {
			return fmt.Errorf("cdp: %s: %w", method, err)
		}
		if in.ID != s.next {
			continue // an event
		}
		if in.Error != nil {
			return fmt.Errorf("cdp: %s: %w", method, in.Error)
		}
		if result == nil || len(in.Result) == 0 {
			return nil
		}
		return jsonv2.Unmarshal(in.Result, result)
	}
}

// Subscribe is not supported: it returns a closed channel.
func (s *cdpSession) Subscribe(string) (<-chan jsonv2.Value, func()) {
	ch := make(chan jsonv2.Value)
	close(ch)
	return ch, func() {}
}

// Close closes the WebSocket.
func (s *cdpSession) Close() error { return s.ws.Close(websocket.StatusNormalClosure, "") }

// cdpTarget is one entry of /json/list.
type cdpTarget struct {
	ID                   string `json:"id"`
	Type                 string `json:"type"`
	URL                  string `json:"url"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// cdpJSON GETs base+path (base is http://host[:port][/prefix]) with hdr and decodes the
// JSON answer into out; errNotReady when it does not answer 200 yet.
func cdpJSON(ctx context.Context, base, path string, hdr http.Header, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return err
	}
	req.Header = hdr.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Join(errNotReady, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s%s: %s", errNotReady, base, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// errNotReady is cdpJSON's error while DevTools does not answer.
var errNotReady = errors.New("cdp: not ready")

// cdpHeader is the sandbox's credential for its DevTools endpoint, as an http.Header.
func cdpHeader(ep *sdk.Endpoint) http.Header {
	h := http.Header{}
	for k, v := range ep.Headers {
		h.Set(k, v)
	}
	return h
}

// waitCDP polls base's /json/version every 5 ms until it answers 200 (or ctx ends).
func waitCDP(ctx context.Context, base string, hdr http.Header) error {
	for {
		var v map[string]any
		err := cdpJSON(ctx, base, "/json/version", hdr, &v)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNotReady) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// firstPage returns the first page target of base's /json/list.
func firstPage(ctx context.Context, t testing.TB, base string, hdr http.Header) cdpTarget {
	t.Helper()
	var list []cdpTarget
	if err := cdpJSON(ctx, base, "/json/list", hdr, &list); err != nil {
		t.Fatal(err)
	}
	for _, tg := range list {
		if tg.Type == "page" {
			return tg
		}
	}
	t.Fatalf("no page target in %s/json/list: %+v", base, list)
	return cdpTarget{}
}

// browserCreate is the create request of a browser sandbox: the image's entrypoint
// (headless Chromium, DevTools on 9222) and res as its resourceLimits (nil: the SDK's
// default, {cpu: 1, memory: 2Gi}).
func browserCreate(img string, res map[string]string) sdk.CreateRequest {
	return sdk.CreateRequest{Image: img, Entrypoint: []string{"/opt/airlock/browser.sh"}, Resources: res,
		NetworkPolicy: json.RawMessage(`{"defaultAction":"deny","egress":[]}`)}
}

// cdpEndpoint returns the gateway's DevTools endpoint of sandbox id as a base URL and
// its credential.
func cdpEndpoint(ctx context.Context, t testing.TB, c *sdk.Client, id string) (string, http.Header) {
	t.Helper()
	ep, err := c.Endpoint(ctx, id, opensandbox.CDPPort)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ep.Endpoint, "/") && len(ep.Headers) == 0 {
		t.Fatalf("DevTools endpoint %+v without a credential", ep)
	}
	return "http://" + ep.Endpoint, cdpHeader(ep)
}
