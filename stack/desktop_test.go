package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sandboximage"
	"github.com/airlockdev/airlock/sdk"
)

// TestStackDesktopThroughGateway: a real desktop sandbox (airlock/desktop, its
// entrypoint running Xvfb, fluxbox, Chromium, x11vnc and websockify) behind a real
// `airlock up`, on each datapath. noVNC's page and its WebSocket (the RFB handshake that
// x11vnc sends, relayed by websockify) answer through every gateway routing form with
// the sandbox's token, through a signed endpoint with nothing else, and through
// lifecycle's server proxy with the token; without a credential each of them is 401,
// audited as an ingress denial on port 6080.
func TestStackDesktopThroughGateway(t *testing.T) {
	img := testenv.NeedDesktopImage(t)
	testenv.NeedBPF(t)
	for _, mode := range []string{"ebpf", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			s, c := startTestStack(t, func(cfg *Config) { cfg.Egress.Mode = mode })
			desktopThroughGateway(t, s, c, img)
		})
	}
}

func desktopThroughGateway(t *testing.T, s *Stack, c *sdk.Client, img string) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, Entrypoint: []string{sandboximage.DesktopEntrypoint}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.ID) }()
	id := sb.ID
	ep, err := c.Endpoint(ctx, id, opensandbox.NoVNCPort)
	if err != nil {
		t.Fatal(err)
	}
	tok := ep.Headers[lifecycle.AccessTokenHeader]
	if len(tok) != 64 || !strings.HasSuffix(ep.Endpoint, "/"+id+"/proxy/6080") {
		t.Fatalf("noVNC endpoint %+v: want the path form with the token header (a control port)", ep)
	}
	gw := s.Gateway.Addr()
	start := time.Now()
	for i := 0; ; i++ {
		if st := get(t, gw, "", "/sandboxes/"+id+"/proxy/6080/vnc.html", lifecycle.AccessTokenHeader, tok); st == http.StatusOK {
			break
		} else if i == 600 {
			t.Fatalf("noVNC never answered through the gateway: %d", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s: create → noVNC page through the gateway in %v", id, time.Since(start).Round(time.Millisecond))

	_, gwPort, _ := net.SplitHostPort(gw)
	p := fmt.Sprint(opensandbox.NoVNCPort)
	forms := []struct {
		name, addr, host, prefix string
		hdr                      []string
	}{
		{"header_ingress_to", gw, "", "", []string{"OpenSandbox-Ingress-To", id + "-" + p}},
		{"header_airlock", gw, "", "", []string{"X-Airlock-Sandbox", id, "X-Airlock-Port", p}},
		{"host_port_first", gw, p + "-" + id + ".airlock.localhost:" + gwPort, "", nil},
		{"host_id_first", gw, id + "-" + p + ".airlock.localhost:" + gwPort, "", nil},
		{"path_proxy", gw, "", "/sandboxes/" + id + "/proxy/" + p, nil},
		{"path_short", gw, "", "/" + id + "/" + p, nil},
		{"server_proxy", s.Addr.String(), "", "/sandboxes/" + id + "/proxy/" + p, nil},
	}
	for _, f := range forms {
		if st := get(t, f.addr, f.host, f.prefix+"/vnc.html", f.hdr...); st != http.StatusUnauthorized {
			t.Errorf("%s: noVNC page without a credential: %d, want 401", f.name, st)
		}
		if _, st, err := rfbHello(ctx, f.addr, f.host, f.prefix, f.hdr...); st != http.StatusUnauthorized {
			t.Errorf("%s: noVNC WebSocket without a credential: %d %v, want 401", f.name, st, err)
		}
		withTok := append([]string{lifecycle.AccessTokenHeader, tok}, f.hdr...)
		if body := getPage(t, f.addr, f.host, f.prefix+"/vnc.html", withTok...); !strings.Contains(body, "<title>noVNC</title>") {
			t.Errorf("%s: noVNC page with the token: %.200q", f.name, body)
		}
		if hello, st, err := rfbHello(ctx, f.addr, f.host, f.prefix, withTok...); err != nil || !strings.HasPrefix(hello, "RFB 003.00") {
			t.Errorf("%s: noVNC WebSocket with the token: %d %q %v, want the RFB handshake", f.name, st, hello, err)
		}
	}
	// A signed endpoint needs nothing else, for the page and its WebSocket.
	signed := signedEndpoint(t, s, id, opensandbox.NoVNCPort)
	host, rest, _ := strings.Cut(signed.Endpoint, "/")
	if body := getPage(t, host, "", "/"+rest+"/vnc.html"); !strings.Contains(body, "<title>noVNC</title>") {
		t.Errorf("signed endpoint %s: noVNC page: %.200q", signed.Endpoint, body)
	}
	if hello, st, err := rfbHello(ctx, host, "", "/"+rest); err != nil || !strings.HasPrefix(hello, "RFB 003.00") {
		t.Errorf("signed endpoint %s: WebSocket: %d %q %v", signed.Endpoint, st, hello, err)
	}

	// Every refusal (a page and a WebSocket per form) is audited as an ingress denial.
	want := 2 * len(forms)
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, _, err := audit.Query(s.AuditDir(), audit.Filter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		denied := 0
		for _, r := range recs {
			if r.Source == audit.SourceIngress && r.Action == "deny" && r.DstPort == opensandbox.NoVNCPort {
				denied++
			}
		}
		if denied >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d ingress denials on port 6080 audited, want %d", denied, want)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// getPage GETs path from addr (Host host when set, with the header pairs) and returns the
// body of a 200, or the status and body otherwise.
func getPage(t *testing.T, addr, host, path string, hdr ...string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
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
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	return string(b)
}

// rfbHello opens noVNC's WebSocket (prefix + "/websockify", subprotocol binary, as
// noVNC does) on addr and returns the first message: the VNC server's ProtocolVersion
// ("RFB 003.008\n", RFC 6143 §7.1.1). st is the handshake's HTTP status.
func rfbHello(ctx context.Context, addr, host, prefix string, hdr ...string) (hello string, st int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	h := http.Header{}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	conn, resp, err := websocket.Dial(ctx, "ws://"+addr+prefix+"/websockify",
		&websocket.DialOptions{HTTPHeader: h, Host: host, Subprotocols: []string{"binary"}})
	if resp != nil {
		st = resp.StatusCode
	}
	if err != nil {
		return "", st, err
	}
	defer conn.CloseNow()
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return "", st, err
	}
	if typ != websocket.MessageBinary {
		return string(b), st, errors.New("not a binary message")
	}
	return string(b), st, nil
}
