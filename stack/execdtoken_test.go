package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// execdCall sends method path (with body) to http://endpoint as OpenSandbox's Go SDK
// does after NewExecdClient(endpoint, token): X-EXECD-ACCESS-TOKEN and nothing else.
func execdCall(t *testing.T, endpoint, token, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+endpoint+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("X-EXECD-ACCESS-TOKEN", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStackExecdTokenOpenSandboxClient: an OpenSandbox Go SDK user takes the endpoint of
// port 44772 and its X-EXECD-ACCESS-TOKEN header only, and every execd call works
// through the gateway and through lifecycle's server proxy (run in the background,
// status, logs, interrupt); another sandbox's token or none is refused.
func TestStackExecdTokenOpenSandboxClient(t *testing.T) {
	s := accessStack(t, "", false)
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var ids []string
	for range 2 {
		sb, err := c.Create(ctx, sdk.CreateRequest{Image: testenv.SandboxImage()})
		if err != nil {
			t.Fatal(err)
		}
		x, err := c.Execd(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	ep, err := c.Endpoint(ctx, ids[0], opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Endpoint(ctx, ids[1], opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	tok := ep.Headers["X-EXECD-ACCESS-TOKEN"]
	if tok == "" || tok == other.Headers["X-EXECD-ACCESS-TOKEN"] || ep.Headers[lifecycle.AccessTokenHeader] == "" {
		t.Fatalf("execd endpoints %+v and %+v: want a distinct X-EXECD-ACCESS-TOKEN each, next to %s", ep, other, lifecycle.AccessTokenHeader)
	}
	if !strings.HasPrefix(ep.Endpoint, s.Gateway.Addr()) {
		t.Fatalf("endpoint %s is not the gateway's", ep.Endpoint)
	}
	serverProxy := s.Addr.String() + "/sandboxes/" + ids[0] + "/proxy/44772"
	for name, endpoint := range map[string]string{"gateway": ep.Endpoint, "server proxy": serverProxy} {
		st, body := execdCall(t, endpoint, tok, "POST", "/command", `{"command":"echo from-go-sdk; sleep 30","background":true}`)
		if st != http.StatusOK {
			t.Fatalf("%s: background command: %d %s", name, st, body)
		}
		var init struct{ Type, Text string }
		if err := json.NewDecoder(strings.NewReader(body)).Decode(&init); err != nil || init.Type != "init" || init.Text == "" {
			t.Fatalf("%s: first event of %q: %v", name, body, err)
		}
		id := init.Text
		if st, body := execdCall(t, endpoint, tok, "GET", "/command/status/"+id, ""); st != http.StatusOK || !strings.Contains(body, `"running":true`) {
			t.Errorf("%s: GetCommandStatus: %d %s", name, st, body)
		}
		for i := 0; ; i++ {
			st, body := execdCall(t, endpoint, tok, "GET", "/command/"+id+"/logs?cursor=0", "")
			if st == http.StatusOK && strings.Contains(body, "from-go-sdk") {
				break
			}
			if i == 50 {
				t.Fatalf("%s: GetCommandLogs: %d %s", name, st, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if st, body := execdCall(t, endpoint, tok, "DELETE", "/command?id="+id, ""); st != http.StatusOK {
			t.Errorf("%s: InterruptCommand: %d %s", name, st, body)
		}
		for _, bad := range []string{"", other.Headers["X-EXECD-ACCESS-TOKEN"], "wrong"} {
			if st, body := execdCall(t, endpoint, bad, "GET", "/command/status/"+id, ""); st != http.StatusUnauthorized {
				t.Errorf("%s with execd token %q: %d %s, want 401", name, bad, st, body)
			}
		}
	}
}

// TestStackSandboxesCannotReachEachOther: a sandbox whose policy allows the Airlock
// network's subnet still cannot reach another sandbox's execd through egressd's
// explicit proxy (which dials from the host, where Docker's inter-container block does
// not apply): neither a command nor the hold's release.
func TestStackSandboxesCannotReachEachOther(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	s, c := startTestStack(t, func(cfg *Config) {
		cfg.Egress = EgressdConfig{Mode: "ebpf", PinRoot: testPinRoot(t), NFTTable: nfttest.Table(t),
			Upstreams: []string{fakeResolver(t)}, L7Port: DefaultEgressdConfig().L7Port, ProxyPort: 13129}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	_, subnet, gw := s.Docker.Network()
	pol := json.RawMessage(fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q}]}`, subnet.Masked().String()))
	a, err := c.Create(ctx, sdk.CreateRequest{Image: img, NetworkPolicy: pol})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Create(ctx, sdk.CreateRequest{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	var xa *sdk.Execd
	for _, id := range []string{a.ID, b.ID} {
		x, err := c.Execd(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if id == a.ID {
			xa = x
		}
	}
	insts, err := s.Docker.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var addrB string
	for _, in := range insts {
		if in.SandboxID == b.ID {
			addrB = in.Address.String()
		}
	}
	if addrB == "" {
		t.Fatalf("sandbox %s has no address", b.ID)
	}
	proxy := fmt.Sprintf("http://%s:13129", gw)
	target := fmt.Sprintf("http://%s:%d", addrB, opensandbox.ExecdPort)
	cmd := fmt.Sprintf(`curl -sS -m 5 -x %[1]s %[2]s/ping -w ' %%{http_code}\n'; `+
		`curl -sS -m 5 -x %[1]s -X POST -H 'Content-Type: application/json' -d '{"entrypoint":["sh","-c","echo pwned"]}' %[2]s%[3]s -w ' %%{http_code}\n'; `+
		`curl -sS -m 5 -x %[1]s -H 'Content-Type: application/json' -d '{"command":"id"}' %[2]s/command -w ' %%{http_code}\n'`,
		proxy, target, opensandbox.ReleasePath)
	ex, err := xa.Run(ctx, sdk.Command{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Join(ex.Stdout, "\n")
	if strings.Count(out, "EGRESS_DENIED") != 3 || strings.Count(out, " 403") != 3 || strings.Contains(out, "uid=") {
		t.Errorf("from sandbox A to sandbox B's execd through the explicit proxy (ping, release, command): %q (stderr %q), want 403 EGRESS_DENIED each", out, ex.Stderr)
	}
}
