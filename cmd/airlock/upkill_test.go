package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// syncBuf is a bytes.Buffer safe to read while a process writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startUp runs `airlock up --config cfg` and returns once it printed its API key; exited
// receives its exit.
func startUp(t *testing.T, bin, cfg string) (up *exec.Cmd, log *syncBuf, exited chan error) {
	t.Helper()
	up = exec.Command(bin, "up", "--config", cfg)
	stdout, err := up.StdoutPipe()
	must(t, err)
	log = &syncBuf{}
	up.Stderr = log
	must(t, up.Start())
	exited = make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		key := regexp.MustCompile(`OPEN-SANDBOX-API-KEY: (\S+)`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if key.MatchString(sc.Text()) {
				close(ready)
			}
		}
		io.Copy(io.Discard, stdout)
		exited <- up.Wait()
	}()
	t.Cleanup(func() { up.Process.Kill() })
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("airlock up exited: %v\n%s", err, log.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("airlock up printed no key in 90 s\n%s", log.String())
	}
	return up, log, exited
}

func hostTable(t *testing.T, name string) bool {
	t.Helper()
	names, err := nftfilter.Tables("")
	must(t, err)
	return slices.Contains(names, name)
}

// TestUpAfterKill: an `airlock up` killed with SIGKILL leaves its nftables tables and
// pinned eBPF state; `airlock down --purge-dead` keeps them while it lives. The next
// `airlock up` with the same configuration replaces them, saying so and naming the dead
// process, and at its orderly stop (SIGTERM, no sandbox) removes them: nothing is left
// on the host.
func TestUpAfterKill(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedDocker(t)
	testenv.NeedBPF(t)
	bin := lctest.Airlock(t)
	dir := t.TempDir()
	pinRoot := fmt.Sprintf("/sys/fs/bpf/airlock-upkilltest-%d", os.Getpid())
	const network = "altest-upkill0"
	t.Cleanup(func() { os.RemoveAll(pinRoot); lctest.RemoveNetwork(network) })
	table := nfttest.Table(t)
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
  subnet: 10.231.8.0/24
  execdPath: %s
`, freeAddr(t), filepath.Join(dir, "state"), freeAddr(t), pinRoot, table,
		dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{}, 60)), network, lctest.Execd(t))), 0o644))

	first, _, exited := startUp(t, bin, cfg)
	if !hostTable(t, table) {
		t.Fatalf("airlock up made no nftables table %s", table)
	}
	purgeDead := []string{"--purge-dead", table, "--purge-dead", filepath.Base(pinRoot)}
	if out := down(t, bin, purgeDead...); !strings.Contains(out, "kept nftables tables "+table) || !hostTable(t, table) {
		t.Fatalf("down --purge-dead beside a live airlock up:\n%s", out)
	}
	must(t, first.Process.Signal(syscall.SIGKILL))
	<-exited
	if !hostTable(t, table) {
		t.Fatalf("the killed airlock up left no table %s (the test proves nothing)", table)
	}
	if _, err := os.Stat(pinRoot); err != nil {
		t.Fatalf("the killed airlock up left no pin root: %v", err)
	}

	second, log, exited := startUp(t, bin, cfg)
	want := regexp.MustCompile(`removed stale host state a dead egressd left.*previous_pid=\"?` + strconv.Itoa(first.Process.Pid) + `.*nftables table inet ` + table)
	if !want.MatchString(log.String()) {
		t.Errorf("the second airlock up did not say it replaced the dead one's state:\n%s", log.String())
	}
	must(t, second.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("airlock up still runs 30 s after SIGTERM")
	}
	if !strings.Contains(log.String(), "removed host state at stop") {
		t.Errorf("no removal at the orderly stop in the log:\n%s", log.String())
	}
	if hostTable(t, table) {
		t.Errorf("table %s left after an orderly stop with no sandbox", table)
	}
	if _, err := os.Stat(pinRoot); !os.IsNotExist(err) {
		t.Errorf("pin root %s left after an orderly stop with no sandbox (err %v)", pinRoot, err)
	}
}
