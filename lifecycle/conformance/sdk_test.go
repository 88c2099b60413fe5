package conformance_test

import (
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/gateway"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// The published OpenSandbox JavaScript SDK (tests/sdk/kube.test.mjs) against a
// lifecycle replica in Kubernetes mode and the gateway following its watch stream:
// sandboxes are pods on a real kube-apiserver, run as real containers by the test
// kubelet, reached through the gateway at their pod IPs.
func TestSDKOnKubernetes(t *testing.T) {
	testenv.NotShort(t, "npm, a kube-apiserver and Docker")
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.SkipOrFail(t, "node is not installed (make prepare installs it)")
	}
	sdkDir := filepath.Join(lctest.ModuleRoot(t), "tests", "sdk")
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "@alibaba-group", "opensandbox")); err != nil {
		npm := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = sdkDir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	env, sandboxNS, systemNS := kubeWorld(t)
	const gatewayKey = "conformance-gateway-key"
	// The gateway's address goes into the replica's endpoints, and the replica's into
	// the gateway's watch: listen first, on a port the gateway then takes over.
	gwAddr := freeAddr(t)
	cp, err := cluster.Start(t.Context(), cluster.Config{
		Kube: env.Config, Listen: "127.0.0.1:0", Namespace: sandboxNS, SystemNamespace: systemNS,
		ExecdImage: "airlock/execd:test", APIKey: apiKey, GatewayKey: gatewayKey, Identity: "sdk",
		LeaseDuration: 2 * time.Second, ReadyTimeout: 90 * time.Second, Gateway: gwAddr,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close() })
	api := "http://" + cp.Addr.String()
	hdr := http.Header{"Open-Sandbox-Api-Key": {apiKey}}
	gw, err := gateway.NewServer(gateway.Config{
		Listen:          gwAddr,
		WatchURL:        api + "/internal/v1/watch",
		WatchHeader:     hdr,
		APIKeySHA256:    accesstoken.Sum(apiKey).String(),
		RenewURL:        api + "/v1/sandboxes/{id}/renew-expiration",
		RenewHeader:     hdr,
		EgressAPIDial:   cp.Addr.String(),
		EgressAPIHeader: http.Header{"Open-Sandbox-Api-Key": {gatewayKey}},
		DataDir:         t.TempDir(),
		Log:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })

	cmd := exec.Command(node, "--test", "--test-concurrency=1", "--test-timeout=600000", "kube.test.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "AIRLOCK_KUBE_DOMAIN="+cp.Addr.String(), "AIRLOCK_KUBE_GATEWAY="+gwAddr,
		"AIRLOCK_KUBE_API_KEY="+apiKey)
	out, err := cmd.CombinedOutput()
	t.Logf("SDK suite on Kubernetes:\n%s", out)
	if err != nil {
		t.Fatalf("the SDK suite failed on Kubernetes: %v", err)
	}
}
