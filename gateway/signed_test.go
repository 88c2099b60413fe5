package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/airlockdev/airlock/lifecycle/watch"
)

// TestSignedURLRevocation: a signed URL verifies under the sandbox's signed-URL epoch
// from the watch stream; once lifecycle bumps the epoch, every URL minted before is 401
// and a URL minted under the new epoch works.
func TestSignedURLRevocation(t *testing.T) {
	e := newEnv(t, nil)
	up := loopback(t)
	sb := runningSandbox("rev", up.addr)
	sb.Access = watch.Access{Mode: watch.Signed}
	e.put(sb)
	exp := time.Now().Add(time.Hour)
	old, err := e.keys.Mint("rev", up.port, exp)
	if err != nil {
		t.Fatal(err)
	}
	if echo := decodeEcho(t, e.do("GET", "", old.Path()+"/before", nil)); echo.Path != "/before" {
		t.Fatalf("signed URL before revocation: echo path %q", echo.Path)
	}
	sb.Access.SignedEpoch = 1
	e.put(sb)
	wantError(t, e.do("GET", "", old.Path()+"/after", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	fresh, err := e.keys.MintEpoch("rev", up.port, exp, 1)
	if err != nil {
		t.Fatal(err)
	}
	if echo := decodeEcho(t, e.do("GET", "", fresh.Path()+"/fresh", nil)); echo.Path != "/fresh" {
		t.Fatalf("signed URL minted under the new epoch: echo path %q", echo.Path)
	}
}
