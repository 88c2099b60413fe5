package lifecycle_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
)

// upProcess is a running `airlock up`.
type upProcess struct {
	cmd *exec.Cmd
	key string
	url string
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startUp runs `airlock up --config cfg` and waits for its banner (at most 60 s).
func startUp(t *testing.T, bin, cfg, addr string) *upProcess {
	t.Helper()
	cmd := exec.Command(bin, "up", "--config", cfg)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(cfg + ".log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
		logf.Close()
	})
	keyRE := regexp.MustCompile(`OPEN-SANDBOX-API-KEY: (\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := keyRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		close(found)
	}()
	select {
	case key, ok := <-found:
		if !ok {
			b, _ := os.ReadFile(cfg + ".log")
			t.Fatalf("airlock up exited before printing its key:\n%s", b)
		}
		return &upProcess{cmd: cmd, key: key, url: "http://" + addr}
	case <-time.After(60 * time.Second):
		t.Fatal("airlock up printed no key within 60 s")
	}
	return nil
}

// TestRestartAfterSIGKILL kills `airlock up` with SIGKILL and starts it again: the same
// sandboxes are listed with the same metadata and expiry, still usable, none duplicated,
// and the API key is the stored one.
func TestRestartAfterSIGKILL(t *testing.T) {
	testenv.NeedSandboxImage(t)
	bin := lctest.Airlock(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "airlock.yaml")
	// Egress off: its datapath state (pin root, the host's nftables table) is one per
	// node, and the egressd tests own it while they run in parallel.
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "listen: %s\nstateDir: %s\negress:\n  disabled: true\ndocker:\n  network: %s\n  namePrefix: %s\n",
		addr, filepath.Join(dir, "state"), lctest.Network, lctest.NamePrefix), 0o600); err != nil {
		t.Fatal(err)
	}
	p1 := startUp(t, bin, cfg, addr)
	c := &client{t: t, base: p1.url, key: p1.key}
	a := c.create(baseReq(testenv.SandboxImage(), map[string]string{"name": "a"}))
	b := c.create(baseReq(testenv.SandboxImage(), map[string]string{"name": "b"}))
	t.Cleanup(func() { removeSandboxContainers(a.ID, b.ID) })
	c.waitState(a.ID, lifecycle.Running)
	c.waitState(b.ID, lifecycle.Running)
	c.want("PATCH", "/v1/sandboxes/"+b.ID+"/metadata", `{"patched":"yes"}`, http.StatusOK, "")

	if err := p1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p1.cmd.Wait()

	p2 := startUp(t, bin, cfg, addr)
	if p2.key != p1.key {
		t.Errorf("API key changed across restarts")
	}
	c2 := &client{t: t, base: p2.url, key: p2.key}
	var l lifecycle.ListResponse
	if err := json.Unmarshal(c2.want("GET", "/v1/sandboxes", nil, http.StatusOK, ""), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 2 {
		t.Fatalf("%d sandboxes after restart, want 2", len(l.Items))
	}
	for _, before := range []lifecycle.Sandbox{a, b} {
		after := c2.get(before.ID)
		if after.Metadata["name"] != before.Metadata["name"] || !after.ExpiresAt.Equal(*before.ExpiresAt) || !after.CreatedAt.Equal(before.CreatedAt) {
			t.Errorf("sandbox %s changed: before %+v after %+v", before.ID, before, after)
		}
		if after.Status.State != lifecycle.Running {
			t.Errorf("sandbox %s is %s after restart", before.ID, after.Status.State)
		}
		c2.want("GET", "/sandboxes/"+before.ID+"/proxy/44772/ping", nil, http.StatusOK, "")
	}
	if c2.get(b.ID).Metadata["patched"] != "yes" {
		t.Errorf("patched metadata lost")
	}
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=airlock.dev/sandbox-id="+a.ID).Output()
	if err != nil || len(regexp.MustCompile(`\S+`).FindAll(out, -1)) != 1 {
		t.Errorf("containers of %s: %q %v", a.ID, out, err)
	}
	// Still fully usable: pause, resume, delete.
	c2.want("POST", "/v1/sandboxes/"+a.ID+"/pause", nil, http.StatusAccepted, "")
	c2.want("POST", "/v1/sandboxes/"+a.ID+"/resume", nil, http.StatusAccepted, "")
	c2.want("DELETE", "/v1/sandboxes/"+a.ID, nil, http.StatusNoContent, "")
	c2.want("DELETE", "/v1/sandboxes/"+b.ID, nil, http.StatusNoContent, "")
}

// removeSandboxContainers removes what a failed test left of these sandboxes.
func removeSandboxContainers(ids ...string) {
	for _, sid := range ids {
		out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=airlock.dev/sandbox-id="+sid).Output()
		for _, id := range regexp.MustCompile(`\S+`).FindAllString(string(out), -1) {
			_ = exec.Command("docker", "rm", "-f", id).Run()
		}
	}
}
