package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestEndpointHook: an EndpointFunc (the gateway's) answers every endpoint request,
// signed ones included; the secure-access header is still lifecycle's.
func TestEndpointHook(t *testing.T) {
	var seen []lifecycle.EndpointRequest
	h := lctest.New(t, lctest.Options{APIKey: testKey, Endpoint: func(er lifecycle.EndpointRequest) (string, error) {
		seen = append(seen, er)
		switch {
		case er.Port == 9:
			return "", fmt.Errorf("%w: port 9 is not routable", lifecycle.ErrInvalidRequest)
		case er.ServerProxy:
			return lifecycle.ServerProxyEndpoint("gw.example:8081", er.ID, er.Port), nil
		case er.Expires != nil:
			return fmt.Sprintf("%d-%s-%d.gw.example", er.Port, er.ID, er.Expires.Unix()), nil
		}
		return fmt.Sprintf("%d-%s.gw.example", er.Port, er.ID), nil
	}})
	c := newClient(t, h)
	req := baseReq(h.Image, nil)
	req["secureAccess"] = true
	sb := c.create(req)
	get := func(q string) lifecycle.Endpoint {
		var ep lifecycle.Endpoint
		_ = json.Unmarshal(c.want("GET", "/v1/sandboxes/"+sb.ID+"/endpoints/8080"+q, nil, http.StatusOK, ""), &ep)
		return ep
	}
	if ep := get(""); ep.Endpoint != "8080-"+sb.ID+".gw.example" || len(ep.Headers[lifecycle.AccessTokenHeader]) != 64 {
		t.Errorf("plain: %+v", ep)
	}
	if ep := get("?use_server_proxy=true"); ep.Endpoint != "gw.example:8081/sandboxes/"+sb.ID+"/proxy/8080" {
		t.Errorf("server proxy: %+v", ep)
	}
	// A signed endpoint is its own credential: no token beside it.
	exp := time.Now().Add(time.Hour).Unix()
	if ep := get(fmt.Sprintf("?expires=%d", exp)); ep.Endpoint != fmt.Sprintf("8080-%s-%d.gw.example", sb.ID, exp) || len(ep.Headers) != 0 {
		t.Errorf("signed: %+v", ep)
	}
	if last := seen[len(seen)-1]; last.Expires == nil || !last.Expires.Equal(time.Unix(exp, 0)) || last.HTTP == nil || last.SignedEpoch != 0 {
		t.Errorf("hook saw %+v", last)
	}
	c.want("GET", "/v1/sandboxes/"+sb.ID+"/endpoints/9", nil, http.StatusBadRequest, "INVALID_REQUEST")
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}

// TestSignedEndpointLifetime: ?expires= more than the maximum signed URL lifetime
// (default 24 h) from now is 400, and the error names the limit; within it is minted.
func TestSignedEndpointLifetime(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: testKey, Endpoint: func(er lifecycle.EndpointRequest) (string, error) {
		return fmt.Sprintf("%d-%s.gw.example", er.Port, er.ID), nil
	}})
	c := newClient(t, h)
	sb := c.create(baseReq(h.Image, nil))
	path := "/v1/sandboxes/" + sb.ID + "/endpoints/8080?expires="
	c.want("GET", path+strconv.FormatInt(time.Now().Add(lifecycle.DefaultMaxSignedURLLifetime-time.Minute).Unix(), 10), nil, http.StatusOK, "")
	for _, exp := range []int64{time.Now().Add(lifecycle.DefaultMaxSignedURLLifetime + time.Minute).Unix(), 4102444800, 1 << 62} {
		b := c.want("GET", path+strconv.FormatInt(exp, 10), nil, http.StatusBadRequest, "INVALID_REQUEST")
		var eb opensandbox.ErrorBody
		if err := json.Unmarshal(b, &eb); err != nil || !strings.Contains(eb.Message, "24h0m0s") {
			t.Errorf("expires=%d: %s, want a message naming the 24h limit", exp, b)
		}
	}
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}

// TestRevokeSignedURLs: POST /sandboxes/{id}/signed-urls/revoke (API key required)
// increments the sandbox's signed-URL epoch, which the next signed endpoint is minted
// under and the watch stream carries to the gateway; unknown sandboxes are 404.
func TestRevokeSignedURLs(t *testing.T) {
	var epochs []uint64
	h := lctest.New(t, lctest.Options{APIKey: testKey, Endpoint: func(er lifecycle.EndpointRequest) (string, error) {
		epochs = append(epochs, er.SignedEpoch)
		return fmt.Sprintf("%d-%s.gw.example", er.Port, er.ID), nil
	}})
	c := newClient(t, h)
	sb := c.create(baseReq(h.Image, nil))
	signed := "/v1/sandboxes/" + sb.ID + "/endpoints/8080?expires=" + strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	revoke := "/v1/sandboxes/" + sb.ID + "/signed-urls/revoke"
	c.want("GET", signed, nil, http.StatusOK, "")
	for want := uint64(1); want <= 2; want++ {
		var r lifecycle.RevokeSignedURLsResponse
		if err := json.Unmarshal(c.want("POST", revoke, nil, http.StatusOK, ""), &r); err != nil || r.SignedURLEpoch != want {
			t.Fatalf("revoke: %+v %v, want epoch %d", r, err, want)
		}
	}
	c.want("GET", signed, nil, http.StatusOK, "")
	if len(epochs) != 2 || epochs[0] != 0 || epochs[1] != 2 {
		t.Errorf("endpoints minted under epochs %v, want [0 2]", epochs)
	}
	if w, ok := h.Server.Hub().Get(sb.ID); !ok || w.Access.SignedEpoch != 2 {
		t.Errorf("watch publishes %+v, want signed epoch 2", w.Access)
	}
	if st := c.status("POST", revoke, "OPEN-SANDBOX-API-KEY", "wrong"); st != http.StatusUnauthorized {
		t.Errorf("revoke with a wrong API key: %d, want 401", st)
	}
	c.want("POST", "/v1/sandboxes/nosuchsandbox/signed-urls/revoke", nil, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}
