package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// syncBuffer is a bytes.Buffer safe for a command writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStandaloneGatewayAuditVerifies runs `airlock gateway` (the real command, flags to
// stack.NewGateway) against a watch stream with one sandbox, proxies real requests to
// it, stops it, and checks its audit directory with `airlock audit verify`: the records
// chain, the files are sealed by checkpoints, and every checkpoint is signed with the
// key the gateway generated at its first start (DIR.key, public key DIR.pub).
func TestStandaloneGatewayAuditVerifies(t *testing.T) {
	clearServerEnv(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the sandbox: %s\n", r.URL.Path)
	}))
	defer upstream.Close()
	_, port, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	hub := watch.NewHub(0, nil)
	hub.Put(watch.Sandbox{ID: "sb1", State: "Running", Address: netip.MustParseAddr("127.0.0.1")})
	hubSrv := httptest.NewServer(hub)
	defer hubSrv.Close()

	dir := filepath.Join(t.TempDir(), "audit")
	out := &syncBuffer{}
	cmd := newGatewayCmd()
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SetArgs([]string{"--listen=127.0.0.1:0", "--watch-url=" + hubSrv.URL + "/watch", "--data-dir=" + t.TempDir(),
		"--audit-dir=" + dir, "--audit-max-file-bytes=2048", "--log-level=error"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	listening := regexp.MustCompile(`gateway listening on (\S+)`)
	var addr string
	for deadline := time.Now().Add(30 * time.Second); addr == ""; {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("airlock gateway exited: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("airlock gateway did not start:\n%s", out.String())
		}
	}
	url := "http://" + addr + "/sandboxes/sb1/proxy/" + port + "/hello"
	get := func() (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for deadline := time.Now().Add(15 * time.Second); ; { // until the route table has sb1
		st, body := get()
		if st == http.StatusOK && strings.Contains(body, "hello from the sandbox: /hello") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no route to sb1 through the gateway: %d %s", st, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	const requests = 40
	for range requests {
		if st, body := get(); st != http.StatusOK {
			t.Fatalf("through the gateway: %d %s", st, body)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("airlock gateway: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("airlock gateway did not stop")
	}

	// What an operator runs: the public key is found beside the directory.
	vout, err := run(t, newAuditCmd(), "verify", dir)
	if err != nil || !strings.Contains(vout, "chain:       ok") {
		t.Fatalf("airlock audit verify %s: %v\n%s", dir, err, vout)
	}
	if !regexp.MustCompile(`signatures:  [1-9]\d* verified with ` + regexp.QuoteMeta(dir+".pub")).MatchString(vout) {
		t.Errorf("airlock audit verify did not check the signatures:\n%s", vout)
	}
	if st, err := os.Stat(dir + ".key"); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("signing key %s.key: %v %v, want mode 0600", dir, st, err)
	}
	pub, err := audit.LoadPublicKey(dir + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(dir, audit.VerifyOptions{PublicKey: pub})
	if err != nil {
		t.Fatalf("verify: %v (%+v)", err, rep)
	}
	if rep.Records < requests+1 || rep.Checkpoints < 2 || rep.VerifiedSignatures != rep.Checkpoints {
		t.Errorf("report %+v: want every request recorded and every checkpoint signed", rep)
	}
	recs, err := audit.Tail(dir, requests, audit.Filter{SandboxID: "sb1"})
	if err != nil || len(recs) != requests {
		t.Fatalf("%d records of sb1, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.Source != audit.SourceGateway || r.Action != "allow" || r.Extra["status"] != float64(http.StatusOK) {
			t.Fatalf("record %+v: want an allowed gateway request answered 200", r)
		}
	}
}
