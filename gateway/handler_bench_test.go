package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// BenchmarkHandlerOverhead measures the airlock handler's own work per request (route,
// admit, rewrite, metrics, audit record) with 10,000 routes, without the proxy: route_only
// with a next handler that answers directly. The port is a public application port, the
// benchmark's and TestBenchGateway's path.
func BenchmarkHandlerOverhead(b *testing.B) {
	benchHandler(b, "http://8080-synthetic-04242.airlock.localhost:8081/plain", nil)
}

// BenchmarkHandlerOverheadToken is BenchmarkHandlerOverhead on execd's port, admitted by
// the sandbox's access token (SHA-256 of the presented token against the stored digest).
func BenchmarkHandlerOverheadToken(b *testing.B) {
	benchHandler(b, "http://44772-synthetic-04242.airlock.localhost:8081/ping",
		http.Header{opensandbox.HeaderSecureAccess: {benchToken}})
}

const benchToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func benchHandler(b *testing.B, url string, hdr http.Header) {
	tab := routetable.New(routetable.Config{})
	digest := accesstoken.Sum(benchToken).String()
	for i := range 10_000 {
		tab.Upsert(watch.Sandbox{ID: fmt.Sprintf("synthetic-%05d", i), State: "Running",
			Address: netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}),
			Access:  watch.Access{TokenSHA256: digest}}, uint64(i+1))
	}
	m, err := newMetrics(nil, func() (bool, float64, int) { return true, 0, 0 })
	if err != nil {
		b.Fatal(err)
	}
	app := &App{table: tab, domains: []string{"airlock.localhost"}, maxConns: 1024, metrics: m, audit: &discardAudit{}}
	h := &Handler{RouteOnly: true, app: app, dec: decider{table: tab, domains: app.domains}}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if caddyhttp.GetVar(r.Context(), VarDial) == nil {
			return fmt.Errorf("no dial")
		}
		_, err := w.Write([]byte("ok\n"))
		return err
	})
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header[k] = v
		}
		repl := caddy.NewReplacer()
		ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
		ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
		req = req.WithContext(ctx)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, req, next); err != nil || w.Code != 200 {
			b.Fatalf("%v %d %s", err, w.Code, w.Body)
		}
	}
}

// BenchmarkRequestSetup is the baseline of BenchmarkHandlerOverhead: the same request
// setup with no handler work.
func BenchmarkRequestSetup(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("GET", "http://8080-synthetic-04242.airlock.localhost:8081/plain", nil)
		repl := caddy.NewReplacer()
		ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
		ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
		req = req.WithContext(ctx)
		w := httptest.NewRecorder()
		_, _ = w.Write([]byte("ok\n"))
	}
}

// discardAudit drops records: the handler's own cost, without the writer's.
type discardAudit struct{}

func (discardAudit) Append(audit.Record) {}
