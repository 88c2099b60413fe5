package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/sdk"
)

// accessStack starts `airlock up` without egress (Docker only) with defaultAccess and,
// when noAuth, no API key.
func accessStack(t *testing.T, defaultAccess string, noAuth bool) *Stack {
	t.Helper()
	testenv.NeedSandboxImage(t)
	s, _ := startTestStack(t, func(cfg *Config) {
		cfg.NoAuth = noAuth
		cfg.Gateway.DefaultAccess = defaultAccess
		cfg.Egress = EgressdConfig{Disabled: true}
	})
	return s
}

// appSandbox creates a sandbox serving HTTP on port 8000 and returns it with its access
// token (from the execd endpoint's headers) once both execd and the app answer.
func appSandbox(t *testing.T, s *Stack, c *sdk.Client) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: testenv.SandboxImage(), Entrypoint: []string{"python3", "-m", "http.server", "8000"}})
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
	ep, err := c.Endpoint(ctx, sb.ID, 44772)
	if err != nil {
		t.Fatal(err)
	}
	tok := ep.Headers[lifecycle.AccessTokenHeader]
	if len(tok) != 64 {
		t.Fatalf("execd endpoint %+v: no access token", ep)
	}
	for i := 0; ; i++ {
		if st := get(t, s.Gateway.Addr(), "", "/sandboxes/"+sb.ID+"/proxy/8000/", lifecycle.AccessTokenHeader, tok); st == http.StatusOK {
			break
		} else if i == 300 {
			t.Fatalf("the app never answered: %d", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sb.ID, tok
}

// signedEndpoint asks lifecycle for a signed endpoint of port valid for an hour.
func signedEndpoint(t *testing.T, s *Stack, id string, port int) sdk.Endpoint {
	t.Helper()
	return endpointWith(t, s, id, port, fmt.Sprintf("expires=%d", time.Now().Add(time.Hour).Unix()))
}

// endpointWith asks lifecycle for the endpoint of port with the query string query.
func endpointWith(t *testing.T, s *Stack, id string, port int, query string) sdk.Endpoint {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v1/sandboxes/%s/endpoints/%d?%s", s.Addr, id, port, query), nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", s.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ep sdk.Endpoint
	if err := json.NewDecoder(resp.Body).Decode(&ep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("endpoint ?%s: %d %v", query, resp.StatusCode, err)
	}
	return ep
}

// get sends GET path to addr with Host host (when set) and the header pairs, and returns
// the status.
func get(t *testing.T, addr, host, path string, hdr ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestStackControlPortsNeedCredential: through a real `airlock up`, a sandbox created
// without secureAccess has execd (44772) and the egress API (18080) closed to requests
// without a credential through every gateway routing form and lifecycle's server proxy;
// the access token the endpoint hands out, the API key and a signed URL open them; the
// application port stays public; refusals are in the audit log as source ingress, with
// neither the token nor the API key anywhere in the log.
func TestStackControlPortsNeedCredential(t *testing.T) {
	s := accessStack(t, "", false)
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := appSandbox(t, s, c)
	gw := s.Gateway.Addr()
	_, gwPort, _ := net.SplitHostPort(gw)
	paths := map[int]string{44772: "/ping", 18080: "/policy"}
	for port, path := range paths {
		p := fmt.Sprint(port)
		forms := []struct {
			name, host, path string
			hdr              []string
		}{
			{"header_ingress_to", "", path, []string{"OpenSandbox-Ingress-To", id + "-" + p}},
			{"header_airlock", "", path, []string{"X-Airlock-Sandbox", id, "X-Airlock-Port", p}},
			{"host_port_first", p + "-" + id + ".airlock.localhost:" + gwPort, path, nil},
			{"host_id_first", id + "-" + p + ".airlock.localhost:" + gwPort, path, nil},
			{"path_proxy", "", "/sandboxes/" + id + "/proxy/" + p + path, nil},
			{"path_short", "", "/" + id + "/" + p + path, nil},
		}
		for _, f := range forms {
			if st := get(t, gw, f.host, f.path, f.hdr...); st != http.StatusUnauthorized {
				t.Errorf("%d %s without a credential: %d, want 401", port, f.name, st)
			}
			for _, cred := range [][]string{
				{lifecycle.AccessTokenHeader, tok}, {"X-Airlock-Access-Token", tok}, {"OPEN-SANDBOX-API-KEY", s.APIKey},
			} {
				if st := get(t, gw, f.host, f.path, append(cred, f.hdr...)...); st != http.StatusOK {
					t.Errorf("%d %s with %s: %d, want 200", port, f.name, cred[0], st)
				}
			}
		}
		// Lifecycle's server proxy.
		proxy := "/sandboxes/" + id + "/proxy/" + p + path
		if st := get(t, s.Addr.String(), "", proxy); st != http.StatusUnauthorized {
			t.Errorf("%d through lifecycle's server proxy without a credential: %d, want 401", port, st)
		}
		if st := get(t, s.Addr.String(), "", proxy, lifecycle.AccessTokenHeader, tok); st != http.StatusOK {
			t.Errorf("%d through lifecycle's server proxy with the token: %d, want 200", port, st)
		}
		// A signed endpoint needs nothing else.
		ep := signedEndpoint(t, s, id, port)
		if len(ep.Headers) != 0 {
			t.Errorf("signed endpoint with headers %v", ep.Headers)
		}
		host, rest, _ := strings.Cut(ep.Endpoint, "/")
		if st := get(t, host, "", "/"+rest+path); st != http.StatusOK {
			t.Errorf("signed endpoint %s: %d, want 200", ep.Endpoint, st)
		}
	}
	// The application port is public by default; its endpoint carries no header.
	if st := get(t, gw, "", "/sandboxes/"+id+"/proxy/8000/"); st != http.StatusOK {
		t.Errorf("application port without a credential: %d, want 200", st)
	}
	if ep, err := c.Endpoint(t.Context(), id, 8000); err != nil || len(ep.Headers) != 0 {
		t.Errorf("application port endpoint %+v %v", ep, err)
	}
	checkEndpointForms(t, s, c, id)

	// Every refusal is audited as ingress; no credential is in the log.
	deadline := time.Now().Add(10 * time.Second)
	var denied int
	for {
		recs, _, err := audit.Query(s.AuditDir(), audit.Filter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		denied = 0
		for _, r := range recs {
			if r.Source == audit.SourceIngress && r.Action == "deny" {
				denied++
			}
		}
		if denied >= 14 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if denied < 14 {
		t.Errorf("%d ingress denials audited for %s, want at least 14 (12 gateway forms + 2 server proxy)", denied, id)
	}
	_ = filepath.WalkDir(s.AuditDir(), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), tok) || strings.Contains(string(b), s.APIKey) {
			t.Errorf("audit file %s holds a credential", p)
		}
		return nil
	})
	if err := c.Kill(t.Context(), id); err != nil {
		t.Fatal(err)
	}
}

// TestStackDefaultAccessTokenNoAuth: with gateway.defaultAccess token and no API key,
// the application port needs the sandbox's token too (and its endpoint says so); the
// egress API still works through the gateway, which forwards it to lifecycle with its own
// credential.
func TestStackDefaultAccessTokenNoAuth(t *testing.T) {
	s := accessStack(t, "token", true)
	if s.APIKey != "" {
		t.Fatalf("noAuth stack has an API key")
	}
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String()})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := appSandbox(t, s, c)
	gw := s.Gateway.Addr()
	for _, path := range []string{"/sandboxes/" + id + "/proxy/8000/", "/sandboxes/" + id + "/proxy/44772/ping", "/sandboxes/" + id + "/proxy/18080/policy"} {
		if st := get(t, gw, "", path); st != http.StatusUnauthorized {
			t.Errorf("gateway %s without the token: %d, want 401", path, st)
		}
		if st := get(t, gw, "", path, lifecycle.AccessTokenHeader, tok); st != http.StatusOK {
			t.Errorf("gateway %s with the token: %d, want 200", path, st)
		}
		if st := get(t, s.Addr.String(), "", path); st != http.StatusUnauthorized {
			t.Errorf("server proxy %s without the token (--no-auth): %d, want 401", path, st)
		}
	}
	ep, err := c.Endpoint(t.Context(), id, 8000)
	if err != nil || ep.Headers[lifecycle.AccessTokenHeader] != tok {
		t.Errorf("application port endpoint under defaultAccess token: %+v %v", ep, err)
	}
	if err := c.Kill(t.Context(), id); err != nil {
		t.Fatal(err)
	}
}

// checkEndpointForms: airlock up hands out the host form for an application port (an
// origin per sandbox port, under airlock.localhost by default) and it reaches the app;
// execd, the egress API and use_server_proxy=true get the path form.
func checkEndpointForms(t *testing.T, s *Stack, c *sdk.Client, id string) {
	t.Helper()
	gw := s.Gateway.Addr()
	_, gwPort, _ := net.SplitHostPort(gw)
	ep, err := c.Endpoint(t.Context(), id, 8000)
	if want := "8000-" + id + ".airlock.localhost:" + gwPort; err != nil || ep.Endpoint != want {
		t.Fatalf("application port endpoint %q %v, want the host form %q", ep.Endpoint, err, want)
	}
	if st := get(t, gw, ep.Endpoint, "/"); st != http.StatusOK {
		t.Errorf("application port through its host-form endpoint %s: %d, want 200", ep.Endpoint, st)
	}
	for _, port := range []int{44772, 18080} {
		ep, err := c.Endpoint(t.Context(), id, port)
		if want := gw + "/sandboxes/" + id + "/proxy/" + fmt.Sprint(port); err != nil || ep.Endpoint != want {
			t.Errorf("control port %d endpoint %q %v, want the path form %q", port, ep.Endpoint, err, want)
		}
	}
	if ep := endpointWith(t, s, id, 8000, "use_server_proxy=true"); ep.Endpoint != gw+"/sandboxes/"+id+"/proxy/8000" {
		t.Errorf("use_server_proxy=true endpoint %q, want the path form", ep.Endpoint)
	}
}
