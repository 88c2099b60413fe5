package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

var update = flag.Bool("update", false, "rewrite golden files")

func adaptCaddyfile(t *testing.T, body string) []byte {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("caddyfile adapter not registered")
	}
	out, warns, err := adapter.Adapt([]byte(body), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warns {
		t.Logf("caddyfile warning: %s", w.String())
	}
	return out
}

// TestCaddyfileGolden adapts the documented Caddyfile syntax (README.md) and compares the
// JSON with testdata/caddyfile.golden.json (-update rewrites it).
func TestCaddyfileGolden(t *testing.T) {
	body, err := os.ReadFile("testdata/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, adaptCaddyfile(t, string(body)), "", "  "); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "caddyfile.golden.json")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(pretty.Bytes())) {
		t.Fatalf("adapted Caddyfile differs from %s (run go test -run TestCaddyfileGolden -update):\n%s", golden, pretty.String())
	}
	// The adapted JSON decodes strictly into the modules.
	var cfg struct {
		Apps struct {
			Airlock json.RawMessage `json:"airlock"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(pretty.Bytes(), &cfg); err != nil {
		t.Fatal(err)
	}
	var app App
	if err := caddy.StrictUnmarshalJSON(cfg.Apps.Airlock, &app); err != nil {
		t.Fatalf("airlock app JSON: %v", err)
	}
	if app.Watch == nil || app.Watch.Headers.Get("Authorization") == "" || len(app.SigningKeys) != 2 || app.Renew == nil ||
		app.EgressAPI == nil || app.EgressAPI.Dial != "127.0.0.1:8080" || app.EgressAPI.Headers.Get("OPEN-SANDBOX-API-KEY") == "" ||
		app.MaxCertificatesPerSandbox != 8 || !app.SignedHostCertificates {
		t.Fatalf("app config lost options: %+v", app)
	}
}

func TestCaddyfileErrors(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for name, body := range map[string]string{
		"unknown_app_option":     "{\n airlock {\n  frobnicate 1\n }\n}\n:80 {\n airlock\n}\n",
		"signing_key_one_arg":    "{\n airlock {\n  signing_key a\n }\n}\n",
		"bad_max_conns":          "{\n airlock {\n  max_conns_per_sandbox many\n }\n}\n",
		"unknown_handler_option": ":80 {\n airlock {\n  frobnicate\n }\n}\n",
		"proxy_with_upstreams":   ":80 {\n airlock {\n  proxy 10.0.0.1:80\n }\n}\n",
		"egress_api_no_dial":     "{\n airlock {\n  egress_api\n }\n}\n",
		"egress_api_bad_option":  "{\n airlock {\n  egress_api 127.0.0.1:8080 {\n   frobnicate\n  }\n }\n}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := adapter.Adapt([]byte(body), nil); err == nil {
				t.Fatal("adapted without error")
			}
		})
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestCaddyfileStockCaddy loads a Caddyfile the way a stock Caddy built with xcaddy would
// (no embedding, Caddy's own metrics registry), in both layouts: the airlock handler with
// its own proxy, and `airlock route_only` followed by `reverse_proxy { dynamic airlock }`.
func TestCaddyfileStockCaddy(t *testing.T) {
	hub := watch.NewHub(0, nil)
	sw := &switchableHub{hub: hub, live: map[chan struct{}]struct{}{}}
	hubSrv := newHTTPServer(t, sw)
	up := loopback(t)
	hub.Put(runningSandbox("cf-box", up.addr))
	p1, p2 := freePort(t), freePort(t)
	caddyfile := `{
	admin off
	persist_config off
	storage file_system ` + t.TempDir() + `
	log default {
		level ERROR
	}
	airlock {
		watch ` + hubSrv + `/watch {
			header Authorization "Bearer watch-secret"
		}
		base_domains airlock.localhost
	}
}
http://127.0.0.1:` + p1 + ` {
	airlock {
		proxy {
			flush_interval -1
		}
	}
}
http://127.0.0.1:` + p2 + ` {
	route {
		airlock route_only
		reverse_proxy {
			dynamic airlock
		}
	}
}
`
	if err := caddy.Load(adaptCaddyfile(t, caddyfile), true); err != nil {
		t.Fatalf("loading adapted Caddyfile: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	client := &http.Client{Timeout: 10 * time.Second}
	for _, port := range []string{p1, p2} {
		url := "http://127.0.0.1:" + port + "/sandboxes/cf-box/proxy/" + itoa(up.port) + "/hello"
		var resp *http.Response
		deadline := time.Now().Add(15 * time.Second)
		for {
			var err error
			resp, err = client.Get(url)
			if err == nil && resp.StatusCode == http.StatusOK {
				break
			}
			if err == nil {
				resp.Body.Close()
			}
			if time.Now().After(deadline) {
				t.Fatalf("port %s: route never became ready (%v)", port, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if echo := decodeEcho(t, resp); echo.Path != "/hello" {
			t.Fatalf("port %s: upstream path %q", port, echo.Path)
		}
	}
	// Unknown sandbox through the route_only layout still gets the JSON error.
	resp, err := client.Get("http://127.0.0.1:" + p2 + "/sandboxes/nobody/proxy/80/")
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, 404, "SANDBOX_NOT_FOUND")
}

func newHTTPServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func TestPermission(t *testing.T) {
	tab := routetable.New(routetable.Config{})
	tab.Upsert(watch.Sandbox{ID: "abc", State: "Paused"}, 1)
	m, err := newMetrics(nil, func() (bool, float64, int) { return false, 0, 0 })
	if err != nil {
		t.Fatal(err)
	}
	p := &Permission{app: &App{table: tab, domains: []string{"sandbox.example.com"}, metrics: m,
		certs: &certHosts{max: DefaultMaxCertificatesPerSandbox}, log: slog.New(slog.DiscardHandler)}}
	for name, want := range map[string]bool{
		"8080-abc.sandbox.example.com":                       true,
		"abc-8080.SANDBOX.example.com":                       true,
		"8080-zzz.sandbox.example.com":                       false,
		"sandbox.example.com":                                false,
		"a.8080-abc.sandbox.example.com":                     false,
		"8080-abc.example.org":                               false,
		"8080-abc-x2qxvk-0123456789abck.sandbox.example.com": false, // signed: no certificate by default
	} {
		if err := p.CertificateAllowed(t.Context(), name); (err == nil) != want {
			t.Errorf("%s: allowed=%v (%v), want %v", name, err == nil, err, want)
		}
	}
}

// TestTLSInternal serves HTTPS with a certificate from the internal CA for the base
// domain and reaches a sandbox by host label over it (h2 via ALPN).
func TestTLSInternal(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, func(c *Config) {
		c.TLS = TLSInternal
		c.DataDir = dir
	})
	up := loopback(t)
	e.put(runningSandbox("tls-box", up.addr))
	name := itoa(up.port) + "-tls-box.airlock.localhost"
	var pool *x509.CertPool
	deadline := time.Now().Add(30 * time.Second)
	for {
		pem, err := os.ReadFile(e.gw.RootCertPath())
		if err == nil {
			pool = x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("internal CA root never appeared at %s", e.gw.RootCertPath())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: name},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.gw.Addr())
		},
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	_, port, _ := net.SplitHostPort(e.gw.Addr())
	var lastErr error
	for time.Now().Before(deadline) {
		resp, err := client.Get("https://" + net.JoinHostPort(name, port) + "/secure")
		if err != nil {
			lastErr = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if resp.TLS == nil || resp.ProtoMajor != 2 {
			t.Fatalf("TLS %v proto %s: want TLS and HTTP/2", resp.TLS != nil, resp.Proto)
		}
		echo := decodeEcho(t, resp)
		if echo.Path != "/secure" || echo.Headers.Get("X-Forwarded-Proto") != "https" {
			t.Fatalf("echo %+v", echo)
		}
		if strings.Contains(e.gw.RootCertPath(), dir) == false {
			t.Fatalf("root cert %s outside the data dir", e.gw.RootCertPath())
		}
		return
	}
	t.Fatalf("no HTTPS response with a certificate from the internal CA: %v", lastErr)
}
