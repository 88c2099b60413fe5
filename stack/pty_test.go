package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

const ptyWait = 30 * time.Second

// ptyRoute is one way to reach a sandbox's execd: base is http://host[:port][/prefix]
// (the PTY routes are appended), hdr the routing headers and credential, hc the client
// (one that dials the gateway whatever the host, for the host forms).
type ptyRoute struct {
	name string
	base string
	hdr  http.Header
	hc   *http.Client
}

func (r ptyRoute) client() *http.Client {
	if r.hc != nil {
		return r.hc
	}
	return http.DefaultClient
}

func (r ptyRoute) ws(id, query string) string {
	u := "ws" + strings.TrimPrefix(r.base, "http") + "/pty/" + id + "/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

// do sends method path (with a JSON body) along r and returns the status and body.
func (r ptyRoute) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, r.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.hdr {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client().Do(req)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", r.name, method, path, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.Bytes()
}

// create makes a PTY session along r.
func (r ptyRoute) create(t *testing.T, req execd.CreatePTYRequest) string {
	t.Helper()
	body, _ := json.Marshal(req)
	st, b := r.do(t, "POST", "/pty", string(body))
	var out execd.CreatePTYResponse
	if err := json.Unmarshal(b, &out); st != http.StatusCreated || err != nil || out.SessionID == "" {
		t.Fatalf("%s: POST /pty: %d %s", r.name, st, b)
	}
	return out.SessionID
}

func (r ptyRoute) offset(t *testing.T, id string) int64 {
	t.Helper()
	st, b := r.do(t, "GET", "/pty/"+id, "")
	var s execd.PTYStatus
	if err := json.Unmarshal(b, &s); st != http.StatusOK || err != nil {
		t.Fatalf("%s: GET /pty/%s: %d %s", r.name, id, st, b)
	}
	return s.OutputOffset
}

func (r ptyRoute) dial(t *testing.T, id, query string) *execdtest.PTYClient {
	t.Helper()
	return execdtest.MustDialPTY(t, r.ws(id, query), r.hdr, r.hc)
}

// refused dials with hdr instead of r's headers and returns the refusal's status.
func (r ptyRoute) refused(t *testing.T, id, query string, hdr http.Header) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), ptyWait)
	defer cancel()
	c, resp, err := execdtest.DialPTY(ctx, r.ws(id, query), hdr, r.hc)
	if err == nil {
		c.WS.CloseNow()
		t.Fatalf("%s: dial %s?%s succeeded", r.name, id, query)
	}
	if resp == nil {
		t.Fatalf("%s: dial %s?%s: %v", r.name, id, query, err)
	}
	return resp.StatusCode
}

// ptySandbox creates a sandbox on s through the Go SDK, waits until its execd answers,
// and returns it with execd's endpoint (its headers carry the tokens).
func ptySandbox(ctx context.Context, t *testing.T, s *Stack) (*sdk.Sandbox, *sdk.Endpoint) {
	t.Helper()
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
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
	ep, err := c.Endpoint(ctx, sb.ID, opensandbox.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	return sb, ep
}

// TestStackPTY drives execd's PTY sessions through a real `airlock up` with a real
// sandbox, as a terminal UI would: through the gateway, a resize seen by `stty size`,
// SIGINT ending `sleep 100` with the exit frame, a reconnect with since= that replays the
// bytes missed meanwhile, a second client refused with 409 that then takes over with
// takeover=1; and every routing form of the gateway (host, header, path, signed path) and
// lifecycle's server proxy carry the WebSocket with the sandbox's credential and refuse
// it without.
func TestStackPTY(t *testing.T) {
	s := accessStack(t, "", false)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb, ep := ptySandbox(ctx, t, s)
	execdTok, accessTok := ep.Headers[lifecycle.ExecdTokenHeader], ep.Headers[lifecycle.AccessTokenHeader]
	if execdTok == "" || accessTok == "" {
		t.Fatalf("execd endpoint %+v without its tokens", ep)
	}
	// What an OpenSandbox client does: the endpoint and its X-EXECD-ACCESS-TOKEN.
	gwRoute := ptyRoute{name: "gateway endpoint", base: "http://" + ep.Endpoint,
		hdr: http.Header{opensandbox.HeaderExecdAccessToken: {execdTok}}}

	t.Run("resize_stty_size", func(t *testing.T) {
		id := gwRoute.create(t, execd.CreatePTYRequest{})
		p := gwRoute.dial(t, id, "")
		p.WaitFor(t, "connected", ptyWait)
		p.Send(t, execd.PTYClientFrame{Type: "resize", Cols: 132, Rows: 43})
		p.Stdin(t, "stty size\n")
		p.Expect(t, "43 132", ptyWait)
	})

	t.Run("sigint_sleep_exit_frame", func(t *testing.T) {
		id := gwRoute.create(t, execd.CreatePTYRequest{Command: "echo sleeping-$((6*7)); exec sleep 100"})
		p := gwRoute.dial(t, id, "")
		p.WaitFor(t, "connected", ptyWait)
		p.Expect(t, "sleeping-42", ptyWait)
		p.Send(t, execd.PTYClientFrame{Type: "signal", Signal: "SIGINT"})
		if f := p.WaitFor(t, "exit", ptyWait); f.JSON.ExitCode == nil || *f.JSON.ExitCode != 130 {
			t.Fatalf("exit frame %+v, want exit_code 130 (SIGINT)", f.JSON)
		}
		if f := p.WaitFor(t, "closed", ptyWait); f.CloseCode != 1000 {
			t.Fatalf("closed with %d (%v), want 1000", f.CloseCode, f.Err)
		}
	})

	t.Run("reconnect_since_409_takeover", func(t *testing.T) {
		id := gwRoute.create(t, execd.CreatePTYRequest{})
		p1 := gwRoute.dial(t, id, "")
		p1.WaitFor(t, "connected", ptyWait)
		if st := gwRoute.refused(t, id, "", gwRoute.hdr); st != http.StatusConflict {
			t.Fatalf("a second client: %d, want 409", st)
		}
		// 5000 bytes after the marker: once the offset moved that far, the marker is in.
		p1.Stdin(t, "sleep 2; echo missed-$((40+2)); printf '%05000d\\n' 0\n")
		p1.Expect(t, "missed-$((40+2))", ptyWait) // the terminal's echo of the line
		p1.WS.CloseNow()
		since := gwRoute.offset(t, id)
		for deadline := time.Now().Add(ptyWait); gwRoute.offset(t, id) < since+5000; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no output while disconnected")
			}
		}
		p2 := gwRoute.dial(t, id, "since="+strconv.FormatInt(since, 10))
		p2.WaitFor(t, "connected", ptyWait)
		if f := p2.WaitFor(t, "replay", ptyWait); f.Offset != since || !strings.Contains(string(f.Data), "missed-42") {
			t.Fatalf("replay at %d (want %d): %q", f.Offset, since, f.Data)
		}
		if st := gwRoute.refused(t, id, "", gwRoute.hdr); st != http.StatusConflict {
			t.Fatalf("a second client: %d, want 409", st)
		}
		p3 := gwRoute.dial(t, id, "takeover=1")
		p3.WaitFor(t, "connected", ptyWait)
		if f := p2.WaitFor(t, "closed", ptyWait); int(f.CloseCode) != int(execd.PTYCloseTakenOver) {
			t.Fatalf("the evicted holder was closed with %d (%v), want 4001", f.CloseCode, f.Err)
		}
		p3.Stdin(t, "echo taken-$((5*5))\n")
		p3.Expect(t, "taken-25", ptyWait)
		if st, b := gwRoute.do(t, "DELETE", "/pty/"+id, ""); st != http.StatusOK {
			t.Fatalf("DELETE: %d %s", st, b)
		}
		p3.WaitFor(t, "exit", ptyWait)
	})

	t.Run("routing_forms", func(t *testing.T) {
		gw := s.Gateway.Addr()
		_, gwPort, _ := net.SplitHostPort(gw)
		toGateway := &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, gw)
			},
		}}
		p := strconv.Itoa(opensandbox.ExecdPort)
		execdHdr := func(kv ...string) http.Header {
			h := http.Header{opensandbox.HeaderExecdAccessToken: {execdTok}}
			for i := 0; i+1 < len(kv); i += 2 {
				h.Set(kv[i], kv[i+1])
			}
			return h
		}
		signed := signedEndpoint(t, s, sb.ID, opensandbox.ExecdPort)
		routes := []ptyRoute{
			{name: "header_ingress_to", base: "http://" + gw, hdr: execdHdr("OpenSandbox-Ingress-To", sb.ID+"-"+p)},
			{name: "header_airlock", base: "http://" + gw, hdr: execdHdr("X-Airlock-Sandbox", sb.ID, "X-Airlock-Port", p)},
			{name: "host_port_first", base: "http://" + p + "-" + sb.ID + ".airlock.localhost:" + gwPort, hdr: execdHdr(), hc: toGateway},
			{name: "host_id_first", base: "http://" + sb.ID + "-" + p + ".airlock.localhost:" + gwPort, hdr: execdHdr(), hc: toGateway},
			{name: "path_proxy", base: "http://" + gw + "/sandboxes/" + sb.ID + "/proxy/" + p, hdr: execdHdr()},
			{name: "path_short", base: "http://" + gw + "/" + sb.ID + "/" + p, hdr: execdHdr()},
			{name: "path_access_token", base: "http://" + gw + "/sandboxes/" + sb.ID + "/proxy/" + p, hdr: http.Header{lifecycle.AccessTokenHeader: {accessTok}}},
			{name: "signed_path", base: "http://" + signed.Endpoint, hdr: http.Header{}},
			{name: "server_proxy", base: "http://" + s.Addr.String() + "/sandboxes/" + sb.ID + "/proxy/" + p, hdr: execdHdr()},
		}
		for i, r := range routes {
			t.Run(r.name, func(t *testing.T) {
				id := r.create(t, execd.CreatePTYRequest{})
				pc := r.dial(t, id, "")
				if f := pc.WaitFor(t, "connected", ptyWait); f.JSON.SessionID != id {
					t.Fatalf("connected frame %+v", f.JSON)
				}
				n := 1000 + i
				pc.Stdin(t, "echo form-$(("+strconv.Itoa(n)+"+1))\n")
				pc.Expect(t, "form-"+strconv.Itoa(n+1), ptyWait)
				pc.WS.CloseNow()
				if r.name == "signed_path" {
					return // the URL is the credential
				}
				// Without a credential (routing headers kept), the handshake is refused.
				bare := http.Header{}
				for k, v := range r.hdr {
					if k != opensandbox.HeaderExecdAccessToken && k != lifecycle.AccessTokenHeader {
						bare[k] = v
					}
				}
				if st := r.refused(t, id, "", bare); st != http.StatusUnauthorized {
					t.Fatalf("without a credential: %d, want 401", st)
				}
				wrong := bare.Clone()
				wrong.Set(opensandbox.HeaderExecdAccessToken, strings.Repeat("0", len(execdTok)))
				if st := r.refused(t, id, "", wrong); st != http.StatusUnauthorized {
					t.Fatalf("with a wrong execd token: %d, want 401", st)
				}
			})
		}
	})
}
