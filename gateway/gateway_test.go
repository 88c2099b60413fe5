package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/gateway/internal/testupstream"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

func decodeEcho(t *testing.T, resp *http.Response) testupstream.Echo {
	t.Helper()
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var e testupstream.Echo
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("echo %q: %v", b, err)
	}
	return e
}

// TestRoutingForms reaches one upstream through every routing form and checks
// what the upstream sees.
func TestRoutingForms(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		addr, port := up.addr, up.port
		e.put(runningSandbox("box-1", addr))
		p := itoa(port)
		routeHeaders := http.Header{"X-Airlock-Access-Token": {"x"}}
		cases := []struct {
			name, host, path string
			hdr              http.Header
			wantPath, prefix string
		}{
			{"host_port_first", e.hostOf(p + "-box-1"), "/a/b?q=1", nil, "/a/b", ""},
			{"host_id_first", e.hostOf("box-1-" + p), "/a", nil, "/a", ""},
			{"header_ingress_to", "", "/x", http.Header{"Opensandbox-Ingress-To": {"box-1-" + p}}, "/x", ""},
			{"header_airlock", "", "/y", http.Header{"X-Airlock-Sandbox": {"box-1"}, "X-Airlock-Port": {p}}, "/y", ""},
			{"path_proxy", "", "/sandboxes/box-1/proxy/" + p + "/z/%2F?q=2", nil, "/z//", "/sandboxes/box-1/proxy/" + p},
			{"path_proxy_root", "", "/sandboxes/box-1/proxy/" + p, nil, "/", "/sandboxes/box-1/proxy/" + p},
			{"path_short", "", "/box-1/" + p + "/w", routeHeaders, "/w", "/box-1/" + p},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				resp := e.do("GET", c.host, c.path, c.hdr)
				rid := resp.Header.Get("X-Request-Id")
				echo := decodeEcho(t, resp)
				if echo.Path != c.wantPath {
					t.Errorf("upstream path %q, want %q", echo.Path, c.wantPath)
				}
				for _, h := range []string{"Opensandbox-Ingress-To", "X-Airlock-Sandbox", "X-Airlock-Port", "X-Airlock-Access-Token"} {
					if _, ok := echo.Headers[h]; ok {
						t.Errorf("upstream saw gateway header %s", h)
					}
				}
				if got := echo.Headers.Get("X-Forwarded-Prefix"); got != c.prefix {
					t.Errorf("X-Forwarded-Prefix %q, want %q", got, c.prefix)
				}
				if echo.Headers.Get("X-Forwarded-For") == "" || echo.Headers.Get("X-Forwarded-Proto") != "http" {
					t.Errorf("X-Forwarded-* not set: %v", echo.Headers)
				}
				if rid == "" || echo.Headers.Get("X-Request-Id") != rid {
					t.Errorf("request id %q not passed upstream (%q)", rid, echo.Headers.Get("X-Request-Id"))
				}
				rec, ok := e.audit.byRequestID(rid)
				if !ok || rec.SandboxID != "box-1" || rec.Action != "allow" || rec.DstPort != port || rec.Extra[auditStatus] != float64(200) {
					t.Errorf("audit record %+v", rec)
				}
			})
		}
		if n := metricValue(t, e.reg, "airlock_gateway_requests_total", map[string]string{"form": "host", "result": "proxied"}); n != 2 {
			t.Errorf("host/proxied requests = %v, want 2", n)
		}
		if n := metricValue(t, e.reg, "airlock_gateway_routes", nil); n != 1 {
			t.Errorf("routes gauge %v, want 1", n)
		}
	})
}

// TestErrors checks every denial: status, JSON body, request id, Retry-After.
func TestErrors(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, func(c *Config) { c.MaxConnsPerSandbox = 1 })
		addr, port := up.addr, up.port
		p := itoa(port)
		past := time.Now().Add(-time.Minute)
		e.put(runningSandbox("live", addr))
		e.put(watch.Sandbox{ID: "paused", State: "Paused", Address: addr})
		e.put(watch.Sandbox{ID: "pending", State: "Pending"})
		e.put(watch.Sandbox{ID: "dead", State: "Terminated", Address: addr})
		e.put(watch.Sandbox{ID: "expired", State: "Running", Address: addr, ExpiresAt: &past})
		e.put(runningSandbox("deleted", addr))
		e.del("deleted")

		cases := []struct {
			name, host, path string
			hdr              http.Header
			status           int
			code             string
		}{
			{"no_route", "", "/", nil, 400, "BAD_ROUTE"},
			{"bad_header", "", "/", http.Header{"Opensandbox-Ingress-To": {"nonsense"}}, 400, "BAD_ROUTE"},
			{"bad_host_label", e.hostOf("www"), "/", nil, 400, "BAD_ROUTE"},
			{"unknown", e.hostOf(p + "-nobody"), "/", nil, 404, "SANDBOX_NOT_FOUND"},
			{"deleted", e.hostOf(p + "-deleted"), "/", nil, 410, "SANDBOX_GONE"},
			{"terminated", "", "/sandboxes/dead/proxy/" + p + "/", nil, 410, "SANDBOX_GONE"},
			{"expired", "", "/sandboxes/expired/proxy/" + p + "/", nil, 410, "SANDBOX_GONE"},
			{"paused", e.hostOf("paused-" + p), "/", nil, 409, "SANDBOX_PAUSED"},
			{"pending_no_address", e.hostOf("pending-" + p), "/", nil, 503, "SANDBOX_NOT_RUNNING"},
			{"nothing_listening", e.hostOf("live-1"), "/", nil, 502, "UPSTREAM_UNAVAILABLE"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				resp := e.do("GET", c.host, c.path, c.hdr)
				eb := wantError(t, resp, c.status, c.code)
				if c.status == 503 && resp.Header.Get("Retry-After") == "" {
					t.Error("503 without Retry-After")
				}
				rec, ok := e.audit.byRequestID(eb.RequestID)
				if !ok || rec.Extra[auditStatus] != float64(c.status) {
					t.Fatalf("audit record %+v", rec)
				}
				if c.status != 502 && rec.Action != "deny" {
					t.Fatalf("audit action %q, want deny", rec.Action)
				}
			})
		}
		t.Run("client_request_id_kept", func(t *testing.T) {
			resp := e.do("GET", e.hostOf(p+"-nobody"), "/", http.Header{"X-Request-Id": {"my-req-42"}})
			if eb := wantError(t, resp, 404, "SANDBOX_NOT_FOUND"); eb.RequestID != "my-req-42" {
				t.Fatalf("request id %q, want the client's", eb.RequestID)
			}
		})
		t.Run("connection_cap", func(t *testing.T) {
			host := e.hostOf(p + "-live")
			resp := e.do("GET", host, "/hold?key=cap", nil)
			defer resp.Body.Close()
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || line != "holding\n" {
				t.Fatalf("hold: %q %v", line, err)
			}
			over := e.do("GET", host, "/", nil)
			wantError(t, over, 429, "TOO_MANY_CONNECTIONS")
			if over.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			// The release goes directly to the upstream: the gateway slot is taken.
			if r, err := http.Get(up.direct("/release?key=cap")); err == nil {
				r.Body.Close()
			}
			_ = readAll(t, resp)
			decodeEcho(t, e.do("GET", host, "/", nil))
		})
		if n := metricValue(t, e.reg, "airlock_gateway_requests_total", map[string]string{"form": "host", "result": "not_found"}); n != 2 {
			t.Errorf("host/not_found = %v, want 2", n)
		}
	})
}

func TestAccessControl(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		addr, port := up.addr, up.port
		p := itoa(port)
		sum := sha256.Sum256([]byte("tok-123"))
		sb := runningSandbox("sec", addr)
		sb.Access = watch.Access{Mode: watch.Token, TokenSHA256: hex.EncodeToString(sum[:]),
			Ports: map[int]watch.AccessMode{port + 1: watch.Public}}
		e.put(sb)
		sg := runningSandbox("sig", addr)
		sg.Access = watch.Access{Mode: watch.Signed, TokenSHA256: hex.EncodeToString(sum[:])}
		e.put(sg)
		pub := runningSandbox("pub", addr)
		e.put(pub)

		now := time.Now()
		valid, _ := e.keys.Mint("sec", port, now.Add(time.Hour))
		validLabel, _ := valid.Label()
		expired, _ := e.keys.Mint("sec", port, now.Add(-time.Hour))
		expiredLabel, _ := expired.Label()
		sigRoute, _ := e.keys.Mint("sig", port, now.Add(time.Hour))
		sigLabel, _ := sigRoute.Label()
		tampered := strings.Replace(validLabel, "-sec-", "-sig-", 1)
		pubSigned, _ := e.keys.Mint("pub", port, now.Add(time.Hour))

		ok := func(t *testing.T, resp *http.Response) testupstream.Echo { return decodeEcho(t, resp) }
		cases := []struct {
			name, host, path string
			hdr              http.Header
			status           int
			code             string
			wantPath         string
		}{
			{"token_missing", e.hostOf(p + "-sec"), "/", nil, 401, "UNAUTHORIZED", ""},
			{"token_airlock_header", e.hostOf(p + "-sec"), "/t", http.Header{"X-Airlock-Access-Token": {"tok-123"}}, 200, "", "/t"},
			{"token_opensandbox_header", e.hostOf(p + "-sec"), "/t", http.Header{"Opensandbox-Secure-Access": {"tok-123"}}, 200, "", "/t"},
			{"token_wrong", e.hostOf(p + "-sec"), "/", http.Header{"X-Airlock-Access-Token": {"nope"}}, 401, "UNAUTHORIZED", ""},
			{"token_wrong_no_fallback_to_signature", e.hostOf(validLabel), "/", http.Header{"X-Airlock-Access-Token": {"nope"}}, 401, "UNAUTHORIZED", ""},
			{"public_port_override", e.hostOf(itoa(port+1) + "-sec"), "/", nil, 502, "UPSTREAM_UNAVAILABLE", ""},
			{"signed_host", e.hostOf(validLabel), "/s", nil, 200, "", "/s"},
			{"signed_header", "", "/h", http.Header{"Opensandbox-Ingress-To": {validLabel}}, 200, "", "/h"},
			{"signed_path", "", valid.Path() + "/v1/status", nil, 200, "", "/v1/status"},
			{"signed_expired", e.hostOf(expiredLabel), "/", nil, 401, "UNAUTHORIZED", ""},
			{"signed_tampered_id", e.hostOf(tampered), "/", nil, 401, "UNAUTHORIZED", ""},
			{"signed_only_port_with_token", e.hostOf(p + "-sig"), "/", http.Header{"X-Airlock-Access-Token": {"tok-123"}}, 403, "FORBIDDEN", ""},
			{"signed_only_port_without", e.hostOf(p + "-sig"), "/", nil, 401, "UNAUTHORIZED", ""},
			{"signed_only_port_signed", e.hostOf(sigLabel), "/ok", nil, 200, "", "/ok"},
			// OSEP-0011: on a public port, signed-looking segments stay part of the app's path.
			{"public_path_keeps_signed_segments", "", pubSigned.Path() + "/x", nil, 200, "", "/" + pubSigned.ExpiresB36 + "/" + pubSigned.Tag + "/x"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				resp := e.do("GET", c.host, c.path, c.hdr)
				if c.status == 200 {
					echo := ok(t, resp)
					if echo.Path != c.wantPath {
						t.Fatalf("upstream path %q, want %q", echo.Path, c.wantPath)
					}
					if echo.Headers.Get("X-Airlock-Access-Token") != "" || echo.Headers.Get("Opensandbox-Secure-Access") != "" {
						t.Fatal("access token reached the sandbox")
					}
					return
				}
				wantError(t, resp, c.status, c.code)
			})
		}
	})
}

// TestDeleteInFlight deletes a sandbox while a response streams from it: the stream is
// cut and new requests get 410. In the sandbox case the container is also removed, as
// lifecycle does right after publishing the deletion.
func TestDeleteInFlight(t *testing.T) {
	run := func(t *testing.T, up upstream, removeRuntime func()) {
		e := newEnv(t, nil)
		e.put(runningSandbox("doomed", up.addr))
		host := e.hostOf(itoa(up.port) + "-doomed")
		resp := e.do("GET", host, "/hold?key=doomed", nil)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "holding\n" {
			t.Fatalf("hold: %q %v", line, err)
		}
		e.del("doomed")
		removeRuntime()
		done := make(chan error, 1)
		go func() {
			_, err := br.ReadString('\n')
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("stream went on after the sandbox was deleted")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("stream to a deleted sandbox still open")
		}
		eb := wantError(t, e.do("GET", host, "/", nil), 410, "SANDBOX_GONE")
		if rec, ok := e.audit.byRequestID(eb.RequestID); !ok || rec.Action != "deny" || rec.SandboxID != "doomed" {
			t.Fatalf("audit %+v", rec)
		}
		// The cut stream is audited as gone.
		if n := metricValue(t, e.reg, "airlock_gateway_requests_total", map[string]string{"form": "host", "result": "gone"}); n != 2 {
			t.Fatalf("host/gone requests %v, want 2 (cut stream + 410)", n)
		}
	}
	t.Run("loopback", func(t *testing.T) { run(t, loopback(t), func() {}) })
	t.Run("sandbox", func(t *testing.T) {
		up, remove := ownSandbox(t, "doomed")
		run(t, up, remove)
	})
}

// TestWatchDown: with lifecycle unreachable the gateway keeps serving known
// routes; when it comes back, the watch resumes and new sandboxes appear.
func TestWatchDown(t *testing.T) {
	forEachUpstream(t, func(t *testing.T, up upstream) {
		e := newEnv(t, nil)
		addr, port := up.addr, up.port
		e.put(runningSandbox("steady", addr))
		e.sw.setDown(true)
		deadline := time.Now().Add(15 * time.Second)
		for e.gw.App().WatchStatus().Connected {
			if time.Now().After(deadline) {
				t.Fatal("watch still connected after lifecycle went down")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if v := metricValue(t, e.reg, "airlock_gateway_watch_connected", nil); v != 0 {
			t.Fatalf("watch_connected %v while down", v)
		}
		decodeEcho(t, e.do("GET", e.hostOf(itoa(port)+"-steady"), "/", nil))
		e.hub.Put(runningSandbox("newcomer", addr)) // published while the gateway cannot see it
		e.sw.setDown(false)
		e.sync()
		decodeEcho(t, e.do("GET", e.hostOf(itoa(port)+"-newcomer"), "/", nil))
		if st := e.gw.App().WatchStatus(); st.Reconnects == 0 {
			t.Fatalf("watch status %+v: want a reconnect", st)
		}
	})
}

// TestNotReadyBeforeFirstSnapshot: until the watch delivered a snapshot, an unknown
// sandbox is "not loaded yet" (503), not "not found".
func TestNotReadyBeforeFirstSnapshot(t *testing.T) {
	e := newEnvEdit(t, nil, nil, func(sw *switchableHub) { sw.setDown(true) })
	resp := e.do("GET", e.hostOf("80-nobody"), "/", nil)
	wantError(t, resp, 503, "GATEWAY_NOT_READY")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	e.sw.setDown(false)
	e.sync()
	deadline := time.Now().Add(15 * time.Second)
	for !e.gw.App().WatchStatus().Synced {
		if time.Now().After(deadline) {
			t.Fatal("watch never synced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	wantError(t, e.do("GET", e.hostOf("80-nobody"), "/", nil), 404, "SANDBOX_NOT_FOUND")
}

// TestRenewOnAccessLoopback checks the renew intent: sent once per interval, with the
// credential, an expiry later than the current one, and never blocking requests.
func TestRenewOnAccessLoopback(t *testing.T) {
	type intent struct {
		path, key string
		body      map[string]string
	}
	var mu sync.Mutex
	var got []intent
	arrived := make(chan struct{}, 8)
	lc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		got = append(got, intent{r.URL.Path, r.Header.Get("OPEN-SANDBOX-API-KEY"), body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"expiresAt":"` + body["expiresAt"] + `"}`))
		arrived <- struct{}{}
	}))
	t.Cleanup(lc.Close)
	up := loopback(t)
	e := newEnv(t, func(c *Config) {
		c.RenewURL = lc.URL + "/v1/sandboxes/{id}/renew-expiration"
		c.RenewHeader = http.Header{"Open-Sandbox-Api-Key": {"lc-key"}}
	})
	addr, port := up.addr, up.port
	exp := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	sb := runningSandbox("renewme", addr)
	sb.ExpiresAt, sb.RenewOnAccess = &exp, 600
	e.put(sb)
	other := runningSandbox("norenew", addr)
	other.ExpiresAt = &exp
	e.put(other)
	for range 5 {
		decodeEcho(t, e.do("GET", e.hostOf(itoa(port)+"-renewme"), "/", nil))
		decodeEcho(t, e.do("GET", e.hostOf(itoa(port)+"-norenew"), "/", nil))
	}
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("no renew intent arrived")
	}
	// Wait for the renew worker to account for the intent, then check nothing else came.
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, e.reg, "airlock_gateway_renew_intents_total", map[string]string{"result": "sent"}) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("renew intent not counted as sent")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d renew intents, want 1 (throttled per sandbox): %+v", len(got), got)
	}
	in := got[0]
	if in.path != "/v1/sandboxes/renewme/renew-expiration" || in.key != "lc-key" {
		t.Fatalf("intent %+v", in)
	}
	newExp, err := time.Parse(time.RFC3339, in.body["expiresAt"])
	if err != nil || !newExp.After(exp) || newExp.Before(time.Now().Add(9*time.Minute)) {
		t.Fatalf("expiresAt %q (%v): want about now+600s, after %s", in.body["expiresAt"], err, exp)
	}
}

// TestH2CLoopback serves an HTTP/2 cleartext client.
func TestH2CLoopback(t *testing.T) {
	e := newEnv(t, nil)
	up := loopback(t)
	addr, port := up.addr, up.port
	e.put(runningSandbox("h2", addr))
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: tr}
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(context.Background(), "GET", e.base()+"/sandboxes/h2/proxy/"+itoa(port)+"/x", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("client spoke %s, want HTTP/2", resp.Proto)
	}
	if echo := decodeEcho(t, resp); echo.Path != "/x" {
		t.Fatalf("path %q", echo.Path)
	}
}
