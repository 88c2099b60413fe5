package egressd

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"
)

// credSession is one intercepted client connection of a sandbox, carrying several
// requests (keep-alive).
type credSession struct {
	conn net.Conn
	br   *bufio.Reader
}

// open starts an intercepted connection of sandbox to the rig's upstream.
func (r *credRig) open(t *testing.T, sandbox string) *credSession {
	t.Helper()
	client, server := net.Pipe()
	go r.cp.serve(server, nil, credTarget{sandbox: sandbox, host: r.host, dst: r.dst, src: "10.0.0.2:4000"}, r.isTLS)
	t.Cleanup(func() { client.Close() })
	var conn net.Conn = client
	if r.isTLS {
		_, _, caPEM, err := r.store.CA(sandbox)
		if err != nil {
			t.Fatal(err)
		}
		pool := r.caPool.Clone()
		pool.AppendCertsFromPEM(caPEM)
		tc := tls.Client(client, &tls.Config{ServerName: r.host, RootCAs: pool})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS with %s's CA: %v", sandbox, err)
		}
		conn = tc
	}
	return &credSession{conn: conn, br: bufio.NewReader(conn)}
}

// get sends GET path on the session and returns the credential and the upstream-side
// remote address (which upstream connection carried it) the upstream saw.
func (s *credSession) get(t *testing.T, path string) (auth, remote string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://example.com"+path, nil)
	if err := req.Write(s.conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(s.br, req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&seen); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	remote, _ = seen["remote"].(string)
	return authOf(seen), remote
}

// TestCredentialUpstreamReuse: the requests of one intercepted connection share one
// upstream connection (keep-alive), and an upstream connection that carried one
// sandbox's credential never carries a request of another sandbox, nor of another
// connection of the same sandbox; it closes when its client connection does.
func TestCredentialUpstreamReuse(t *testing.T) {
	for _, isTLS := range []bool{true, false} {
		t.Run(map[bool]string{true: "https", false: "http"}[isTLS], func(t *testing.T) {
			r := newCredRig(t, isTLS)
			a1 := r.open(t, "sbx")
			var first string
			for i := range 3 {
				auth, remote := a1.get(t, "/v1/x")
				if auth != "Bearer "+credSecret {
					t.Fatalf("sbx request %d: Authorization %q", i, auth)
				}
				if i == 0 {
					first = remote
				} else if remote != first {
					t.Errorf("request %d of one connection went on upstream connection %s, the first on %s: no reuse", i, remote, first)
				}
			}
			// Another sandbox, same name and address, while sbx's upstream connection idles.
			b := r.open(t, "sbx2")
			for i := range 2 {
				auth, remote := b.get(t, "/v1/x")
				if auth != "" {
					t.Fatalf("sbx2 request %d reached the upstream with Authorization %q", i, auth)
				}
				if remote == first {
					t.Fatalf("sbx2 request %d rode sbx's upstream connection %s (which carries sbx's credential)", i, remote)
				}
			}
			// Another connection of the same sandbox gets its own upstream connection.
			a2 := r.open(t, "sbx")
			if auth, remote := a2.get(t, "/v1/x"); remote == first || auth != "Bearer "+credSecret {
				t.Errorf("second connection of sbx: upstream connection %s (first %s), Authorization %q", remote, first, auth)
			}
			a1.conn.Close()
			deadline := time.Now().Add(5 * time.Second)
			for _, ok := r.closed.Load(first); !ok; _, ok = r.closed.Load(first) {
				if time.Now().After(deadline) {
					t.Fatalf("upstream connection %s still open after its client connection closed", first)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
