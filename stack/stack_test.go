package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	lctest.RemoveNetwork("altest-up0")
	os.Exit(code)
}

// TestStartFailureStopsInReverse: when the last component (the listener) cannot start,
// Start fails and every started component is stopped (the store's lock is released).
func TestStartFailureStopsInReverse(t *testing.T) {
	testenv.NeedDocker(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	cfg := Config{Listen: busy.Addr().String(), StateDir: dir, Egress: EgressdConfig{Disabled: true},
		Docker: DockerConfig{Network: "altest-up0", ExecdPath: lctest.Execd(t)}}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "starting api") {
		t.Fatalf("Start: %v", err)
	}
	st, err := boltstore.Open(filepath.Join(dir, "lifecycle.db"))
	if err != nil {
		t.Fatalf("store still locked after a failed start: %v", err)
	}
	st.Close()

	// The same configuration on a free port starts and stops cleanly.
	cfg.Listen = "127.0.0.1:0"
	s, err = New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Addr == nil || s.APIKey == "" || s.Lifecycle == nil {
		t.Errorf("started stack %+v", s)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestStackThroughGateway starts the whole stack (store, audit, Docker, lifecycle, API,
// gateway) and drives a real sandbox through the endpoints lifecycle hands out: they
// point at the gateway, commands stream through it event by event, files go both ways,
// access tokens and signed endpoints work, and every request is audited.
func TestStackThroughGateway(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	dir := t.TempDir()
	cfg := Config{
		Listen: "127.0.0.1:0", StateDir: dir,
		Gateway: GatewayConfig{Listen: "127.0.0.1:0"},
		Egress: EgressdConfig{Mode: "ebpf", PinRoot: testPinRoot(t), NFTTable: nfttest.Table(t),
			Upstreams: []string{fakeResolver(t)}, L7Port: DefaultEgressdConfig().L7Port, ProxyPort: 13128},
		Docker: DockerConfig{Network: "altest-up0", ExecdPath: lctest.Execd(t), NamePrefix: lctest.NamePrefix},
	}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		lctest.RemoveAll(t, s.Docker)
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	gw := s.Gateway.Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, SecureAccess: true})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := c.Endpoint(ctx, sb.ID, 44772)
	if err != nil {
		t.Fatal(err)
	}
	if want := gw + "/sandboxes/" + sb.ID + "/proxy/44772"; ep.Endpoint != want {
		t.Fatalf("endpoint %q, want the gateway's %q", ep.Endpoint, want)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// The first line must arrive while the command still runs: it waits for a file that
	// the test creates (through the gateway too) only after seeing that line. A buffering
	// proxy deadlocks here and the context ends the test.
	ex, err := x.Run(ctx, sdk.Command{Command: "echo first; while [ ! -f /tmp/go ]; do sleep 0.05; done; echo second"}, func(ev sdk.Event) error {
		if ev.Type == "stdout" && ev.Text == "first" {
			return x.WriteFile(ctx, "/tmp/go", strings.NewReader("go"), 0)
		}
		return nil
	})
	if err != nil || strings.Join(ex.Stdout, ",") != "first,second" || ex.ExitCode() != 0 {
		t.Fatalf("streamed run %+v %v", ex, err)
	}
	payload := strings.Repeat("airlock gateway ", 1<<16)
	if err := x.WriteFile(ctx, "/tmp/big.txt", strings.NewReader(payload), 0); err != nil {
		t.Fatal(err)
	}
	if b, err := x.ReadFile(ctx, "/tmp/big.txt"); err != nil || string(b) != payload {
		t.Fatalf("download through the gateway: %d bytes, %v", len(b), err)
	}

	// Secure access: without the token the gateway answers 401; a signed endpoint
	// reaches execd with no other credential.
	if resp, err := http.Get("http://" + ep.Endpoint + "/ping"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v1/sandboxes/%s/endpoints/44772?expires=%d", s.Addr, sb.ID, time.Now().Add(time.Hour).Unix()), nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", s.APIKey)
	var signed sdk.Endpoint
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		err = json.NewDecoder(resp.Body).Decode(&signed)
		resp.Body.Close()
		if err != nil || !strings.HasPrefix(signed.Endpoint, gw+"/"+sb.ID+"/44772/") {
			t.Fatalf("signed endpoint %+v %v", signed, err)
		}
	}
	resp, err := http.Get("http://" + signed.Endpoint + "/ping")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("signed endpoint %s: %d %s", signed.Endpoint, resp.StatusCode, body)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// Egress: the networkPolicy given at creation is enforced by the embedded egressd.
	pol := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)
	sb2, err := c.Create(ctx, sdk.CreateRequest{Image: img, NetworkPolicy: pol})
	if err != nil {
		t.Fatal(err)
	}
	x2, err := c.Execd(ctx, sb2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x2.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Egress.Datapath().Attached(), sb2.ID) {
		t.Errorf("egressd has not attached %s: %v", sb2.ID, s.Egress.Datapath().Attached())
	}
	for name, want := range map[string]string{"allowed.test": "203.0.113.10", "denied.test": ""} {
		ex, err := x2.Run(ctx, sdk.Command{Command: "getent hosts " + name + " | cut -d' ' -f1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(ex.Stdout, ""); got != want {
			t.Errorf("%s resolves to %q in the sandbox, want %q", name, got, want)
		}
	}
	// The explicit proxy: every new sandbox has HTTP_PROXY pointing at it, and it
	// applies the sandbox's policy (the default-deny datapath lets the proxy through).
	_, _, bridgeGW := s.Docker.Network()
	px, err := x2.Run(ctx, sdk.Command{Command: `echo "$HTTPS_PROXY"; curl -sS -m 3 http://denied.test/`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "http://" + bridgeGW.String() + ":13128"; len(px.Stdout) < 2 || px.Stdout[0] != want ||
		!strings.Contains(px.Stdout[1], "EGRESS_DENIED") {
		t.Errorf("HTTPS_PROXY and a denied name through the explicit proxy: %q, want %s and EGRESS_DENIED", px.Stdout, want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, _, err := audit.Query(cfg.StateDir+"/audit", audit.Filter{SandboxID: sb2.ID})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(recs, func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.DstHost == "denied.test" && r.Action == "deny"
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no DNS denial audited for %s: %+v", sb2.ID, recs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The OpenSandbox egress API (port 18080) through the gateway: lifecycle answers, for
	// requests with the header its endpoint gives (never public).
	egressEP, err := c.Endpoint(ctx, sb2.ID, 18080)
	if err != nil {
		t.Fatal(err)
	}
	egressURL := "http://" + gw + "/sandboxes/" + sb2.ID + "/proxy/18080/policy"
	patch := func(hdr map[string]string) int {
		preq, _ := http.NewRequest(http.MethodPatch, egressURL, strings.NewReader(`[{"action":"allow","target":"*.npmjs.org"}]`))
		for k, v := range hdr {
			preq.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(preq)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := patch(nil); st != http.StatusUnauthorized {
		t.Fatalf("PATCH %s without a credential: %d, want 401", egressURL, st)
	}
	if st := patch(egressEP.Headers); st != http.StatusOK {
		t.Fatalf("PATCH %s with the endpoint's headers %v: %d", egressURL, egressEP.Headers, st)
	}
	greq, _ := http.NewRequest(http.MethodGet, egressURL, nil)
	greq.Header.Set("OPEN-SANDBOX-API-KEY", s.APIKey)
	resp, err = http.DefaultClient.Do(greq)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Status string `json:"status"`
		Policy struct {
			Egress []struct{ Action, Target string } `json:"egress"`
		} `json:"policy"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Status != "ok" || len(st.Policy.Egress) != 2 || st.Policy.Egress[0].Target != "*.npmjs.org" {
		t.Errorf("GET %s: %+v %v", egressURL, st, err)
	}
	if err := c.Kill(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}

	// Every gateway decision is in the hash-chained audit log.
	deadline = time.Now().Add(10 * time.Second)
	for s.Audit.Synced() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	recs, _, err := audit.Query(cfg.StateDir+"/audit", audit.Filter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	// (The sandbox's first record is the control-plane record of its create.)
	if !slices.ContainsFunc(recs, func(r audit.Record) bool { return r.Source == audit.SourceGateway }) {
		t.Errorf("audit records for %s: %+v", sb.ID, recs)
	}
}

// fakeResolver is the upstream the embedded egressd forwards to: loopback only,
// allowed.test and denied.test exist, everything else is NXDOMAIN.
func fakeResolver(t *testing.T) string {
	return dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{
		"allowed.test.": netip.MustParseAddr("203.0.113.10"), "denied.test.": netip.MustParseAddr("203.0.113.20"),
	}, 60))
}

// testPinRoot is a bpffs directory of the test's own for the eBPF datapath.
func testPinRoot(t *testing.T) string {
	testenv.NeedBPF(t)
	var b [4]byte
	rand.Read(b[:])
	p := filepath.Join("/sys/fs/bpf", "airlock-uptest-"+hex.EncodeToString(b[:]))
	t.Cleanup(func() { os.RemoveAll(p) })
	return p
}

// startTestStack starts the whole stack for a test: gateway and eBPF egress on a pin
// root of its own, the fake resolver upstream (unless mut changes them or turns egress
// off), the test network; mut adjusts the configuration first. It returns the running stack and a
// client of its API; everything is stopped and removed at the end of the test.
func startTestStack(t *testing.T, mut func(*Config)) (*Stack, *sdk.Client) {
	t.Helper()
	cfg := Config{
		Listen: "127.0.0.1:0", StateDir: t.TempDir(),
		Gateway: GatewayConfig{Listen: "127.0.0.1:0"},
		Egress:  EgressdConfig{Mode: "ebpf", L7Port: DefaultEgressdConfig().L7Port},
		Docker:  DockerConfig{Network: "altest-up0", ExecdPath: lctest.Execd(t), NamePrefix: lctest.NamePrefix},
	}
	if mut != nil {
		mut(&cfg)
	}
	if !cfg.Egress.Disabled {
		if cfg.Egress.PinRoot == "" {
			cfg.Egress.PinRoot = testPinRoot(t)
		}
		if cfg.Egress.NFTTable == "" {
			cfg.Egress.NFTTable = nfttest.Table(t)
		}
		if cfg.Egress.Upstreams == nil {
			cfg.Egress.Upstreams = []string{fakeResolver(t)}
		}
	}
	s, err := New(cfg, nil)
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
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}
