package signedurl_test

import (
	"fmt"
	"time"

	"github.com/airlockdev/airlock/gateway/signedurl"
)

// The signed endpoint is also a known-answer vector for the tag (checked independently
// with Python hmac + base64.b32hexencode).
//
// Lifecycle builds one Endpoints value from its configuration and answers
// GET /sandboxes/{id}/endpoints/{port}[?expires=<unix seconds>] with it. Signed
// endpoints are always in the path form, even with a base domain.
func ExampleEndpoints() {
	key, _ := signedurl.ParseKey("a=hex:000102030405060708090a0b0c0d0e0f")
	keys, _ := signedurl.NewKeyring("a", key)
	ep := signedurl.Endpoints{Gateway: "127.0.0.1:8081", BaseDomain: "airlock.localhost", Keys: keys}

	fmt.Println(ep.Endpoint("sbx1", 44772))
	fmt.Println(ep.ServerProxy("sbx1", 44772))
	signed, _ := ep.Signed("sbx1", 8080, time.Unix(2_000_000_000, 0), 0)
	fmt.Println(signed)
	// Output:
	// 44772-sbx1.airlock.localhost:8081
	// 127.0.0.1:8081/sandboxes/sbx1/proxy/44772
	// 127.0.0.1:8081/sbx1/8080/x2qxvk/qcpih1cv8os92a
}
