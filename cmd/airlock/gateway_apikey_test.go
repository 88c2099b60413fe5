package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestStandaloneGatewayRefusesAPIKey runs `airlock gateway` (the real command) with and
// without --refuse-api-key, which the Kubernetes manifests pass, in front of a sandbox
// whose ports need a token: refused, the API key alone gets 401 while the sandbox's
// access token still admits; without the flag the key admits, as before.
func TestStandaloneGatewayRefusesAPIKey(t *testing.T) {
	clearServerEnv(t)
	const apiKey, token = "admin-api-key-of-the-test", "the-sandbox-access-token"
	t.Setenv("OPEN_SANDBOX_API_KEY", apiKey)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get(opensandbox.HeaderAPIKey); v != "" {
			t.Errorf("the sandbox received the API key")
		}
		_, _ = w.Write([]byte("sandbox"))
	}))
	defer upstream.Close()
	_, port, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	hub := watch.NewHub(0, nil)
	hub.Put(watch.Sandbox{ID: "sb1", State: "Running", Address: netip.MustParseAddr("127.0.0.1"),
		Access: watch.Access{Mode: watch.Token, TokenSHA256: accesstoken.Sum(token).String()}})
	hubSrv := httptest.NewServer(hub)
	defer hubSrv.Close()

	for _, tc := range []struct {
		name       string
		flags      []string
		wantAPIKey int
	}{
		{"refuse_api_key", []string{"--refuse-api-key"}, http.StatusUnauthorized},
		{"default", nil, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--listen=127.0.0.1:0", "--watch-url=" + hubSrv.URL + "/watch",
				"--data-dir=" + t.TempDir(), "--base-domain=", "--log-level=error"}, tc.flags...)
			addr := startGatewayCommand(t, args)
			url := "http://" + addr + "/sandboxes/sb1/proxy/" + port + "/x"
			get := func(name, value string) int {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if name != "" {
					req.Header.Set(name, value)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			for deadline := time.Now().Add(15 * time.Second); get(opensandbox.HeaderAccessToken, token) != http.StatusOK; {
				if time.Now().After(deadline) {
					t.Fatal("the sandbox's access token never admitted a request (no route to sb1?)")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if st := get(opensandbox.HeaderAPIKey, apiKey); st != tc.wantAPIKey {
				t.Errorf("with the API key: %d, want %d", st, tc.wantAPIKey)
			}
			if st := get("", ""); st != http.StatusUnauthorized {
				t.Errorf("without a credential: %d, want 401", st)
			}
		})
	}
}

// startGatewayCommand runs `airlock gateway args...` until the test ends and returns
// the address it listens on.
func startGatewayCommand(t *testing.T, args []string) string {
	t.Helper()
	out := &syncBuffer{}
	cmd := newGatewayCmd()
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("airlock gateway: %v\n%s", err, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("airlock gateway did not stop")
		}
	})
	listening := regexp.MustCompile(`gateway listening on (\S+)`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-done:
			t.Fatalf("airlock gateway exited: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("airlock gateway did not start:\n%s", out.String())
		}
	}
}
