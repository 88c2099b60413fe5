package lifecycle_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/lifecycle"
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
	if ep := get("?expires=4102444800"); ep.Endpoint != "8080-"+sb.ID+"-4102444800.gw.example" || len(ep.Headers) != 0 {
		t.Errorf("signed: %+v", ep)
	}
	if last := seen[len(seen)-1]; last.Expires == nil || !last.Expires.Equal(time.Unix(4102444800, 0)) || last.HTTP == nil {
		t.Errorf("hook saw %+v", last)
	}
	c.want("GET", "/v1/sandboxes/"+sb.ID+"/endpoints/9", nil, http.StatusBadRequest, "INVALID_REQUEST")
	c.want("DELETE", "/v1/sandboxes/"+sb.ID, nil, http.StatusNoContent, "")
}
