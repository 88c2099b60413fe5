package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// memAudit is an in-memory AuditSink.
type memAudit struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (m *memAudit) Append(r audit.Record) {
	m.mu.Lock()
	m.recs = append(m.recs, r)
	m.mu.Unlock()
}

func (m *memAudit) byRequestID(id string) (audit.Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.recs {
		if r.Extra[auditRequestID] == id {
			return r, true
		}
	}
	return audit.Record{}, false
}

// switchableHub serves a watch.Hub and can go "down": it then answers 503 and ends the
// streams in progress, as a stopped lifecycle server would.
type switchableHub struct {
	hub  *watch.Hub
	down atomic.Bool
	mu   sync.Mutex
	live map[chan struct{}]struct{}
}

func (s *switchableHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get("Authorization") != "Bearer watch-secret" {
		http.Error(w, "no credential", http.StatusUnauthorized)
		return
	}
	stop := make(chan struct{})
	s.mu.Lock()
	s.live[stop] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.live, stop)
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	s.hub.ServeHTTP(w, r.WithContext(ctx))
}

func (s *switchableHub) setDown(down bool) {
	s.down.Store(down)
	if !down {
		return
	}
	s.mu.Lock()
	for c := range s.live {
		close(c)
		delete(s.live, c)
	}
	s.mu.Unlock()
}

// env is a running embedded gateway fed by an in-process watch hub.
type env struct {
	t      *testing.T
	hub    *watch.Hub
	sw     *switchableHub
	gw     *Server
	audit  *memAudit
	reg    *prometheus.Registry
	keys   *signedurl.Keyring
	client *http.Client
}

var testKey = signedurl.Key{ID: "k", Secret: []byte("gateway-test-signing-secret-0123")}

// newEnv starts a hub and a gateway on a free loopback port; mod may change the config.
func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	return newEnvEdit(t, mod, nil, nil)
}

// newEnvEdit is newEnv with edit applied to the Caddy JSON before it is loaded and
// before called on the hub before the gateway starts.
func newEnvEdit(t *testing.T, mod func(*Config), edit func([]byte) []byte, before func(*switchableHub)) *env {
	t.Helper()
	e := &env{t: t, hub: watch.NewHub(0, nil), audit: &memAudit{}, reg: prometheus.NewRegistry()}
	e.sw = &switchableHub{hub: e.hub, live: map[chan struct{}]struct{}{}}
	hubSrv := httptest.NewServer(e.sw)
	t.Cleanup(hubSrv.Close)
	if before != nil {
		before(e.sw)
	}
	var err error
	e.keys, err = signedurl.NewKeyring("k", testKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Listen:        "127.0.0.1:0",
		WatchURL:      hubSrv.URL + "/watch",
		WatchHeader:   http.Header{"Authorization": {"Bearer watch-secret"}},
		SigningKeys:   []signedurl.Key{testKey},
		CaddyLogLevel: "ERROR",
		Audit:         e.audit,
		Metrics:       e.reg,
		ShutdownGrace: time.Second,
		DataDir:       t.TempDir(),
	}
	if mod != nil {
		mod(&cfg)
	}
	e.gw, err = NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		e.gw.json = edit(e.gw.json)
	}
	if err := e.gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.gw.Close() })
	if before == nil { // the hub is up: wait for the first snapshot
		deadline := time.Now().Add(15 * time.Second)
		for !e.gw.App().WatchStatus().Synced {
			if time.Now().After(deadline) {
				t.Fatal("gateway never received the first watch snapshot")
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	addr := e.gw.Addr()
	e.client = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			},
			MaxIdleConnsPerHost: 64,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

// sync waits until the gateway has applied every change the hub published.
func (e *env) sync() {
	e.t.Helper()
	want := e.hub.ResourceVersion()
	deadline := time.Now().Add(15 * time.Second)
	for e.gw.App().Table().ResourceVersion() < want {
		if time.Now().After(deadline) {
			e.t.Fatalf("gateway did not reach watch resource version %d (at %d)", want, e.gw.App().Table().ResourceVersion())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (e *env) put(sb watch.Sandbox) {
	e.t.Helper()
	e.hub.Put(sb)
	e.sync()
}

func (e *env) del(id string) {
	e.t.Helper()
	e.hub.Delete(id)
	e.sync()
}

// base returns http://<gateway addr>.
func (e *env) base() string { return "http://" + e.gw.Addr() }

// get sends a request; host, when set, is the Host header (the connection always goes to
// the gateway).
func (e *env) do(method, host, path string, hdr http.Header) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.base()+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return b
}

// hostOf returns a host-form Host header with the gateway's port.
func (e *env) hostOf(label string) string {
	_, port, _ := net.SplitHostPort(e.gw.Addr())
	return label + ".airlock.localhost:" + port
}

// wantError checks a JSON error response and returns its body.
func wantError(t *testing.T, resp *http.Response, status int, code string) opensandbox.ErrorBody {
	t.Helper()
	b := readAll(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q, want application/json", ct)
	}
	var eb opensandbox.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("error body %q is not JSON: %v", b, err)
	}
	if eb.Code != code || eb.Message == "" {
		t.Fatalf("error body %+v, want code %s and a message", eb, code)
	}
	if rid := resp.Header.Get("X-Request-Id"); rid == "" || rid != eb.RequestID {
		t.Fatalf("request id header %q, body %q: want equal and set", rid, eb.RequestID)
	}
	return eb
}

// runningSandbox returns a Running sandbox at addr (ip only; ports come from the route).
func runningSandbox(id string, addr netip.Addr) watch.Sandbox {
	return watch.Sandbox{ID: id, State: "Running", Address: addr}
}

// splitHostPort returns the address and port of a loopback test server URL.
func splitHostPort(t *testing.T, hostport string) (netip.Addr, int) {
	t.Helper()
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(hostport, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return ap.Addr(), int(ap.Port())
}

// metricValue returns the value of one series of a gathered metric (counter or gauge).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matchLabels(m.GetLabel(), labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				}
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func matchLabels(have []*dto.LabelPair, want map[string]string) bool {
	n := 0
	for _, lp := range have {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func itoa(n int) string { return strconv.Itoa(n) }
