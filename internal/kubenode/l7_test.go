package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// checkL7 shows the transparent L7 check on the node: a sandbox whose policy says
// `l7: sni` and allows only name (which the cluster DNS answers with addr) reaches a TLS
// server at addr:443 under that name, and not under another name at the same address:
// the node redirects the sandbox's TCP 443 to egressd's proxy on the node-local
// resolver address, which splices a connection only when its SNI is allowed and the
// address was learned for that name. The server runs on this host with addr on the
// node's bridge (removed again before checkL7 returns).
func checkL7(ctx context.Context, t *testing.T, c *sdk.Client, name, addr string) {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", Bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s dev %s: %v: %s", addr, Bridge, err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "addr", "del", addr+"/32", "dev", Bridge).CombinedOutput(); err != nil {
			t.Errorf("ip addr del %s dev %s: %v: %s", addr, Bridge, err, out)
		}
	}()
	l, err := net.Listen("tcp4", net.JoinHostPort(addr, "443"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "l7-ok %s", r.Host)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	defer srv.Close()

	policy := fmt.Sprintf(`{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":%q}]}`, name)
	sb, err := c.Create(ctx, sdk.CreateRequest{
		Image: nodeSandboxImage, Timeout: 10 * time.Minute, NetworkPolicy: json.RawMessage(policy),
		Resources: map[string]string{"cpu": "500m", "memory": "256Mi"}, Entrypoint: []string{"tail", "-f", "/dev/null"},
	})
	if err != nil {
		t.Fatalf("create the l7 sandbox: %v", err)
	}
	defer func() { _ = c.Kill(context.Background(), sb.ID) }()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := c.WaitState(wctx, sb.ID, opensandbox.Running, 250*time.Millisecond); err != nil {
		t.Fatalf("l7 sandbox %s not Running: %v", sb.ID, err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	run := func(command string) string {
		ex, err := x.Run(ctx, sdk.Command{Command: command}, nil)
		if err != nil {
			t.Fatalf("running %q in the l7 sandbox: %v", command, err)
		}
		return strings.Join(ex.Stdout, " ")
	}
	// The allowed name: resolved through egressd (learned), its SNI allowed, spliced.
	if got := run(fmt.Sprintf(`curl -sk --max-time 5 https://%s/ 2>&1; echo " rc=$?"`, name)); !strings.HasPrefix(got, "l7-ok "+name) {
		t.Errorf("https://%s/ (allowed name) from the l7 sandbox: %q, want the server's l7-ok", name, got)
	} else {
		t.Logf("l7: https://%s/ from the sandbox: %q", name, got)
	}
	// Another name at the same (learned) address: the proxy reads the SNI and closes.
	other := "not-allowed.example"
	got := run(fmt.Sprintf(`curl -sk --max-time 5 --resolve %s:443:%s https://%s/ 2>&1; echo " rc=$?"`, other, addr, other))
	if strings.Contains(got, "l7-ok") || strings.HasSuffix(got, " rc=0") {
		t.Errorf("https://%s/ at %s (a name outside the policy) from the l7 sandbox: %q, want refused by the L7 check", other, addr, got)
	} else {
		t.Logf("l7: https://%s/ at %s from the sandbox: %q", other, addr, got)
	}
}
