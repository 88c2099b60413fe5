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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
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
// and the API key is the stored one. A warm pool is configured: the sandboxes are
// claimed from it, and its members survive the restart without leaking or doubling.
func TestRestartAfterSIGKILL(t *testing.T) {
	testenv.NeedSandboxImage(t)
	bin := lctest.Airlock(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "airlock.yaml")
	// Egress off: its datapath state (pin root, the host's nftables table) is one per
	// node, and the egressd tests own it while they run in parallel.
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "listen: %s\nstateDir: %s\negress:\n  disabled: true\ndocker:\n  network: %s\n  namePrefix: %s\n"+
		"pools:\n  - name: warm\n    image: %s\n    size: 2\n    resourceLimits: {cpu: 500m, memory: 256Mi}\n",
		addr, filepath.Join(dir, "state"), lctest.Network, lctest.NamePrefix, testenv.SandboxImage()), 0o600); err != nil {
		t.Fatal(err)
	}
	p1 := startUp(t, bin, cfg, addr)
	c := &client{t: t, base: p1.url, key: p1.key}
	waitPoolMetric(t, c, 2)
	a := c.create(baseReq(testenv.SandboxImage(), map[string]string{"name": "a"}))
	b := c.create(baseReq(testenv.SandboxImage(), map[string]string{"name": "b"}))
	instance := instanceOf(t, a.ID)
	t.Cleanup(func() { removeInstanceContainers(instance) })
	if a.Status.State != opensandbox.Running || b.Status.State != opensandbox.Running {
		t.Errorf("creates were not claimed from the full pool: %s %s", a.Status.State, b.Status.State)
	}
	waitPoolMetric(t, c, 2)
	c.waitState(a.ID, opensandbox.Running)
	c.waitState(b.ID, opensandbox.Running)
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
	waitPoolMetric(t, c2, 2)
	if n := len(instanceContainers(instance)); n != 4 {
		t.Errorf("%d containers after restart, want 2 sandboxes + 2 pool members", n)
	}
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
		if after.Status.State != opensandbox.Running {
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

// waitPoolMetric waits until the server's metrics show ready members in the pool
// "warm" (at most 2 min).
func waitPoolMetric(t *testing.T, c *client, ready int) {
	t.Helper()
	want := fmt.Sprintf(`airlock_lifecycle_pool_members{pool="warm",state="ready"} %d`, ready)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, b := c.do("GET", "/metrics", nil)
		if strings.Contains(string(b), want) && strings.Contains(string(b), `airlock_lifecycle_pool_members{pool="warm",state="warming"} 0`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never showed %q", want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// instanceOf reads the instance label of sandbox id's container.
func instanceOf(t *testing.T, id string) string {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=airlock.dev/sandbox-id="+id,
		"--format", `{{.Label "airlock.dev/instance"}}`).Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("instance of %s: %q %v", id, out, err)
	}
	return strings.TrimSpace(string(out))
}

// instanceContainers lists the containers of an airlock instance.
func instanceContainers(instance string) []string {
	out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=airlock.dev/instance="+instance).Output()
	return regexp.MustCompile(`\S+`).FindAllString(string(out), -1)
}

// removeInstanceContainers removes what a test's airlock instance left (pool members
// stay by design when airlock stops).
func removeInstanceContainers(instance string) {
	for _, id := range instanceContainers(instance) {
		_ = exec.Command("docker", "rm", "-f", id).Run()
	}
}
