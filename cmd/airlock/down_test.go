package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/moby/moby/client"
	"github.com/vishvananda/netns"

	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle/docker"
)

// TestDownPurge runs a real `airlock up` (eBPF datapath, its own network and pin root)
// with a sandbox, then `airlock down --purge`: no process, container, network, pinned
// map or nftables table is left, the state is gone and the audit log kept; then
// --purge-audit removes the audit log, and a third run finds nothing. The nftables
// table is made in a network namespace of the test (the host's table belongs to the
// other tests running now).
func TestDownPurge(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedDocker(t)
	image := testenv.NeedSandboxImage(t)
	bin := lctest.Airlock(t)
	dir := t.TempDir()
	pinRoot := fmt.Sprintf("/sys/fs/bpf/airlock-downtest-%d", os.Getpid())
	const network = "altest-down0"
	t.Cleanup(func() { os.RemoveAll(pinRoot); lctest.RemoveNetwork(network) })
	table := nfttest.Table(t)
	api, gw := freeAddr(t), freeAddr(t)
	state := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "airlock.yaml")
	must(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: %s
stateDir: %s
gateway:
  listen: %s
egress:
  mode: ebpf
  pinRoot: %s
  nftTable: %s
  upstreams: [%s]
docker:
  network: %s
  subnet: 10.231.7.0/24
  execdPath: %s
`, api, state, gw, pinRoot, table, dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{}, 60)), network, lctest.Execd(t))), 0o644))

	ns := fmt.Sprintf("aldown%d", os.Getpid())
	nsPath := "/run/netns/" + ns
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	nftTable(t, nsPath, table, true)

	up := exec.Command(bin, "up", "--config", cfg)
	stdout, err := up.StdoutPipe()
	must(t, err)
	var upLog bytes.Buffer
	up.Stderr = &upLog
	must(t, up.Start())
	exited := make(chan error, 1)
	apiKey := make(chan string, 1)
	go func() {
		key := regexp.MustCompile(`OPEN-SANDBOX-API-KEY: (\S+)`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := key.FindStringSubmatch(sc.Text()); m != nil {
				apiKey <- m[1]
			}
		}
		io.Copy(io.Discard, stdout)
		exited <- up.Wait()
	}()
	t.Cleanup(func() { up.Process.Kill() })
	var key string
	select {
	case key = <-apiKey:
	case err := <-exited:
		t.Fatalf("airlock up exited: %v\n%s", err, upLog.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("airlock up printed no key in 90 s\n%s", upLog.String())
	}

	req, _ := http.NewRequest("POST", "http://"+api+"/v1/sandboxes",
		strings.NewReader(`{"image":{"uri":"`+image+`"},"entrypoint":["tail","-f","/dev/null"],"timeout":600}`))
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	cli := lctest.Docker(t)
	ours := client.Filters{}.Add("label", docker.LabelManagedBy).Add("network", network)
	if n := containers(t, cli, ours); n != 1 {
		t.Fatalf("%d containers on %s after a create, want 1", n, network)
	}
	waitFor(t, "pinned eBPF state", func() bool { e, _ := os.ReadDir(filepath.Join(pinRoot, "maps")); return len(e) > 0 })
	if _, err := os.Stat(filepath.Join(state, "airlock.pid")); err != nil {
		t.Fatalf("no pid file while airlock up runs: %v", err)
	}

	out := down(t, bin, "--config", cfg, "--purge", "--nft-netns", nsPath)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("airlock up still runs after airlock down:\n%s", out)
	}
	for _, want := range []string{"stopped airlock up", "removed container", "removed network " + network,
		"removed pinned eBPF state " + pinRoot, "removed nftables table inet " + table, "kept the audit log"} {
		if !strings.Contains(out, want) {
			t.Errorf("down --purge output lacks %q:\n%s", want, out)
		}
	}
	if n := containers(t, cli, ours); n != 0 {
		t.Errorf("%d containers left on %s", n, network)
	}
	if _, err := cli.NetworkInspect(t.Context(), network, client.NetworkInspectOptions{}); err == nil {
		t.Errorf("network %s left", network)
	}
	if _, err := os.Stat(pinRoot); !os.IsNotExist(err) {
		t.Errorf("pinned state %s left (err %v)", pinRoot, err)
	}
	nftTable(t, nsPath, table, false)
	entries, _ := os.ReadDir(state)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"audit", "audit.key", "audit.pub"}; !slices.Equal(left, want) {
		t.Errorf("state dir after --purge holds %v, want only the audit log and its key pair %v", left, want)
	}
	if logs, _ := os.ReadDir(filepath.Join(state, "audit")); len(logs) == 0 {
		t.Error("the audit log was not kept")
	}

	out = down(t, bin, "--config", cfg, "--purge-audit", "--nft-netns", nsPath)
	if !strings.Contains(out, "removed "+filepath.Join(state, "audit")) || !strings.Contains(out, "removed "+filepath.Join(state, "audit.key")) {
		t.Errorf("--purge-audit output:\n%s", out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir %s left after --purge-audit (err %v)", state, err)
	}
	if out = down(t, bin, "--config", cfg, "--purge", "--nft-netns", nsPath); !strings.Contains(out, "nothing to remove") {
		t.Errorf("a second purge found something:\n%s", out)
	}
}

func down(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"down"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("airlock down %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func containers(t *testing.T, cli *client.Client, f client.Filters) int {
	t.Helper()
	res, err := cli.ContainerList(t.Context(), client.ContainerListOptions{All: true, Filters: f})
	must(t, err)
	return len(res.Items)
}

// nftTable creates (make) or checks the absence of (!make) the inet table named table
// in the namespace at nsPath.
func nftTable(t *testing.T, nsPath, table string, make bool) {
	t.Helper()
	h, err := netns.GetFromPath(nsPath)
	must(t, err)
	defer h.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	must(t, err)
	if make {
		tb := conn.AddTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
		conn.AddChain(&nftables.Chain{Name: "sbx_test", Table: tb})
		must(t, conn.Flush())
		return
	}
	if _, err := conn.ListTableOfFamily(table, nftables.TableFamilyINet); err == nil {
		t.Errorf("nftables table inet %s left in %s", table, nsPath)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no %s after 10 s", what)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
