package egressd

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/egressd/nftfilter/nfttest"
	"github.com/airlockdev/airlock/sdk"
)

// deadHelperEnv, set, turns the test binary into the datapath of an egressd that the
// test then kills with SIGKILL (TestMain runs deadEgressdHelper instead of the tests):
// "<table> <l7 port>".
const deadHelperEnv = "AIRLOCK_TEST_DEAD_EGRESSD"

// deadEgressdHelper builds what egressd builds at start (nftables datapath, the
// l7_redirect chain to an L7 port where nothing listens), prints "ready" and waits to
// be killed.
func deadEgressdHelper(arg string) int {
	f := strings.Fields(arg)
	port, _ := strconv.Atoi(f[1])
	dp, err := enforcer.New(enforcer.Config{Mode: enforcer.ModeNFTables, NFT: nftfilter.Config{Table: f[0]}, L7ProxyPort: uint16(port)})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	_ = dp
	os.Stdout.WriteString("ready\n")
	select {}
}

// otherEgressd starts deadEgressdHelper on table with the L7 port l7Port and returns
// once its tables exist; kill kills it with SIGKILL (what a killed test run or airlock
// up does), leaving its tables behind.
func otherEgressd(t *testing.T, table string, l7Port int) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), deadHelperEnv+"="+table+" "+strconv.Itoa(l7Port))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	t.Cleanup(kill)
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		kill()
		t.Fatalf("the other egressd did not start: %q", line)
	}
	return kill
}

// killedEgressd is otherEgressd, killed at once; it checks the tables are left.
func killedEgressd(t *testing.T, table string, l7Port int) {
	t.Helper()
	otherEgressd(t, table, l7Port)()
	if !hasTable(t, table) {
		t.Fatalf("the killed egressd left no table %s", table)
	}
}

func hasTable(t *testing.T, name string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListTableOfFamily(name, nftables.TableFamilyINet)
	return err == nil
}

// TestEgressdL7BesideOtherEgressd: another egressd on this host with its own tables
// (another installation, a test side by side), whose l7_redirect chain sends marked TCP
// to its own L7 port (where nothing listens here), starts after this one: this egressd's
// sandboxes must still get their HTTP to this egressd's L7 proxy, with either backend,
// while the other runs and after it was killed and left its tables. The kernel runs the
// newer chain first and the first redirect wins: with one L7 mark shared by every
// table the other's chain took the connection (refused).
func TestEgressdL7BesideOtherEgressd(t *testing.T) {
	w := newWorld(t)
	const policy = `{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":"allowed.test"}]}`
	w.eachBackend(t, policy, func(t *testing.T, d *Daemon, _ *sdk.Sandbox, x *sdk.Execd) {
		other := nfttest.Table(t)
		kill := otherEgressd(t, other, 15009)
		if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
			t.Errorf("HTTP to the allowed name beside another egressd = %q, want allowed", got)
		}
		kill()
		if !hasTable(t, other) {
			t.Fatalf("the killed egressd left no table %s", other)
		}
		if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
			t.Errorf("HTTP to the allowed name beside a killed egressd's tables = %q, want allowed", got)
		}
	}, func(c *Config) { c.L7Port = 15001 })
}

// TestEgressdHostStateClaim: an egressd started on the tables and pin root a killed one
// left (same configuration) replaces them and its L7 redirect reaches its own proxy;
// while it runs nobody else can claim them; an orderly stop with no sandbox left
// removes its tables and pinned state.
func TestEgressdHostStateClaim(t *testing.T) {
	w := newWorld(t)
	killedEgressd(t, w.nftTable, 15009)
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			pins := pinRoot(t)
			d, stop := w.daemon(t, mode, pins, func(c *Config) { c.L7Port = 15001 })
			_, err := enforcer.ClaimHost(enforcer.Config{EBPF: EBPFBackend(pins), NFT: nftfilter.Config{Table: w.nftTable}})
			if !errors.Is(err, enforcer.ErrInUse) {
				t.Errorf("claiming the tables of a running egressd: %v, want ErrInUse", err)
			}
			sb, x := w.create(t, d, `{"defaultAction":"deny","l7":"sni","egress":[{"action":"allow","target":"allowed.test"}]}`)
			if got := curl(t, x, "http://allowed.test/"); got != "allowed" {
				t.Errorf("HTTP through the L7 proxy after the dead egressd = %q, want allowed", got)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := w.api.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, d, sb.ID, false)
			stop()
			if hasTable(t, w.nftTable) {
				t.Errorf("table %s left after an orderly stop with no sandbox", w.nftTable)
			}
			if _, err := os.Stat(pins); !os.IsNotExist(err) {
				t.Errorf("pin root %s left after an orderly stop with no sandbox: %v", pins, err)
			}
		})
	}
}
