package gateway

import (
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// fakeCDP answers like Chromium's DevTools HTTP handler on a random 127/8 address at
// port 9222: it refuses a Host that is not an IP address (as Chromium does), names
// r.Host in its /json answers, and echoes WebSocket messages on /devtools/….
func fakeCDP(t *testing.T) netip.Addr {
	t.Helper()
	mux := http.NewServeMux()
	hostOK := func(w http.ResponseWriter, r *http.Request) bool {
		h, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			h = r.Host
		}
		if _, err := netip.ParseAddr(h); err != nil && h != "localhost" {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", http.StatusInternalServerError)
			return false
		}
		return true
	}
	mux.HandleFunc("/json/version", func(w http.ResponseWriter, r *http.Request) {
		if hostOK(w, r) {
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			_, _ = w.Write([]byte(`{"Browser": "Chrome/150.0.0.0", "webSocketDebuggerUrl": "ws://` + r.Host + `/devtools/browser/b1"}`))
		}
	})
	list := func(w http.ResponseWriter, r *http.Request) {
		if hostOK(w, r) {
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			_, _ = w.Write([]byte(`[ {"devtoolsFrontendUrl": "/devtools/inspector.html?ws=` + r.Host + `/devtools/page/P1", "id": "P1", "type": "page", "url": "about:blank", "webSocketDebuggerUrl": "ws://` + r.Host + `/devtools/page/P1"} ]`))
		}
	}
	mux.HandleFunc("/json/list", list)
	mux.HandleFunc("/json", list)
	mux.HandleFunc("/json/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"webSocketDebuggerUrl": "ws://` + r.Host + `/devtools/x", "pad": "` + strings.Repeat("x", cdpMaxBody) + `"}`))
	})
	mux.Handle("/devtools/", websocket.Handler(func(c *websocket.Conn) {
		var msg string
		for websocket.Message.Receive(c, &msg) == nil {
			if websocket.Message.Send(c, c.Request().URL.Path+" "+msg) != nil {
				return
			}
		}
	}))
	for range 10 {
		var b [3]byte
		_, _ = rand.Read(b[:])
		addr := netip.AddrFrom4([4]byte{127, 1 + b[0]%250, b[1], 1 + b[2]%250})
		ln, err := net.Listen("tcp", net.JoinHostPort(addr.String(), itoa(opensandbox.CDPPort)))
		if err != nil {
			continue
		}
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: mux}}
		srv.Start()
		t.Cleanup(srv.Close)
		return addr
	}
	t.Fatal("no free 127/8 address for port 9222")
	return netip.Addr{}
}

// TestCDPThroughEveryForm: the DevTools port answers 401 without a credential through
// every routing form, even for a public sandbox; with one, /json/version and /json/list
// name WebSocket URLs of the gateway (the client's host and the route's prefix) instead
// of the sandbox's address, and those URLs lead to the browser's WebSockets through the
// gateway with the same headers.
func TestCDPThroughEveryForm(t *testing.T) {
	addr := fakeCDP(t)
	e := newEnv(t, withAPIKey)
	sb := runningSandbox("cdp", addr)
	sb.Access = watch.Access{Mode: watch.Public, TokenSHA256: accesstoken.Sum(testAccessToken).String()}
	e.put(sb)
	p := itoa(opensandbox.CDPPort)
	gw := e.gw.Addr()
	tok := http.Header{opensandbox.HeaderSecureAccess: {testAccessToken}}
	signed, _ := e.keys.Mint("cdp", opensandbox.CDPPort, time.Now().Add(time.Hour))
	forms := []struct {
		name, host, prefix string
		hdr                http.Header // routing headers, sent again on the WebSocket
		cred               http.Header
	}{
		{"header_ingress_to", gw, "", http.Header{"Opensandbox-Ingress-To": {"cdp-" + p}}, tok},
		{"header_airlock", gw, "", http.Header{"X-Airlock-Sandbox": {"cdp"}, "X-Airlock-Port": {p}}, tok},
		{"host", e.hostOf(p + "-cdp"), "", nil, tok},
		{"path_proxy", gw, "/sandboxes/cdp/proxy/" + p, nil, tok},
		{"path", gw, "/cdp/" + p, nil, tok},
		{"path_signed", gw, signed.Path(), nil, nil},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			if f.cred != nil {
				eb := wantError(t, e.do("GET", f.host, f.prefix+"/json/version", f.hdr), http.StatusUnauthorized, "UNAUTHORIZED")
				e.wantIngressDenial(t, eb, "cdp", opensandbox.CDPPort)
			}
			hdr := merged(f.hdr, f.cred)
			resp := e.do("GET", f.host, f.prefix+"/json/version", hdr)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/json/version: %d %s", resp.StatusCode, body)
			}
			var v struct {
				WS string `json:"webSocketDebuggerUrl"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatalf("/json/version %s: %v", body, err)
			}
			if want := "ws://" + f.host + f.prefix + "/devtools/browser/b1"; v.WS != want {
				t.Fatalf("webSocketDebuggerUrl %q, want %q", v.WS, want)
			}
			resp = e.do("GET", f.host, f.prefix+"/json/list", hdr)
			body = readAll(t, resp)
			var l []struct {
				Frontend string `json:"devtoolsFrontendUrl"`
				WS       string `json:"webSocketDebuggerUrl"`
			}
			if err := json.Unmarshal(body, &l); err != nil || len(l) != 1 {
				t.Fatalf("/json/list %s: %v", body, err)
			}
			if want := "ws=" + f.host + f.prefix + "/devtools/page/P1"; !strings.HasSuffix(l[0].Frontend, want) || l[0].WS != "ws://"+f.host+f.prefix+"/devtools/page/P1" {
				t.Fatalf("/json/list names %+v, want the gateway (%s)", l[0], want)
			}
			if strings.Contains(string(body), addr.String()) || resp.Header.Get("Content-Length") != itoa(len(body)) {
				t.Fatalf("/json/list (Content-Length %s) still names the sandbox or has the wrong length: %s", resp.Header.Get("Content-Length"), body)
			}
			// Follow the URL as a CDP client does, with the same headers.
			u, err := url.Parse(v.WS)
			if err != nil {
				t.Fatal(err)
			}
			ws := e.dialWebSocketHeaders(t, u.Host, u.Path, hdr)
			if err := websocket.Message.Send(ws, `{"id":1}`); err != nil {
				t.Fatal(err)
			}
			var got string
			if err := websocket.Message.Receive(ws, &got); err != nil || got != `/devtools/browser/b1 {"id":1}` {
				t.Fatalf("WebSocket echo %q, %v", got, err)
			}
		})
	}
	t.Run("big_answer_unchanged", func(t *testing.T) {
		resp := e.do("GET", "", "/cdp/"+p+"/json/big", tok)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || len(body) < cdpMaxBody || !strings.Contains(string(body), "ws://"+addr.String()+":"+p) {
			t.Fatalf("an answer over the bound: %d, %d bytes", resp.StatusCode, len(body))
		}
	})
}

// dialWebSocketHeaders opens a WebSocket to the gateway with Host host, the path and
// extra request headers.
func (e *env) dialWebSocketHeaders(t *testing.T, host, path string, hdr http.Header) *websocket.Conn {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+host+path, "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header = hdr.Clone()
	conn, err := net.DialTimeout("tcp", e.gw.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		t.Fatalf("websocket handshake through the gateway (%s%s): %v", host, path, err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func TestRewriteCDP(t *testing.T) {
	in := `{"devtoolsFrontendUrl":"https://x/inspector.html?ws=10.0.0.2:9222/devtools/page/A","webSocketDebuggerUrl":"ws://10.0.0.2:9222/devtools/page/A","url":"http://10.0.0.2:9222/"}`
	got := string(rewriteCDP([]byte(in), "10.0.0.2:9222", "gw.example:443/p", "wss"))
	want := `{"devtoolsFrontendUrl":"https://x/inspector.html?wss=gw.example:443/p/devtools/page/A","webSocketDebuggerUrl":"wss://gw.example:443/p/devtools/page/A","url":"http://10.0.0.2:9222/"}`
	if got != want {
		t.Errorf("rewriteCDP:\n got %s\nwant %s", got, want)
	}
}
