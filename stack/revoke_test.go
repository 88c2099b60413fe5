package stack

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/sdk"
)

// TestStackRevokeSignedURLs: through a real `airlock up`, a signed URL to execd opens
// it; once the operator revokes the sandbox's signed URLs (the sdk's
// POST /v1/sandboxes/{id}/signed-urls/revoke) the gateway refuses it with 401 within the
// watch latency, and a signed URL minted afterwards works.
func TestStackRevokeSignedURLs(t *testing.T) {
	s := accessStack(t, "", false)
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + s.Addr.String(), APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := appSandbox(t, s, c)
	status := func(ep sdk.Endpoint) int {
		addr, path, _ := strings.Cut(ep.Endpoint, "/")
		return get(t, addr, "", "/"+path+"/ping")
	}
	old := signedEndpoint(t, s, id, 44772)
	if st := status(old); st != http.StatusOK {
		t.Fatalf("signed URL %s: %d, want 200", old.Endpoint, st)
	}
	epoch, err := c.RevokeSignedURLs(t.Context(), id)
	if err != nil || epoch != 1 {
		t.Fatalf("revoke: epoch %d, %v", epoch, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := status(old)
		if st == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revoked signed URL: %d, want 401", st)
		}
	}
	if fresh := signedEndpoint(t, s, id, 44772); status(fresh) != http.StatusOK {
		t.Fatalf("signed URL minted after the revocation %s refused", fresh.Endpoint)
	}
}
