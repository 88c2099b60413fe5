// Package lctest holds what the lifecycle and Docker runtime tests share: building
// execd, a lifecycle server on a real Docker engine with its own store, network and
// container names, and cleanup of everything a test created.
package lctest

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/lifecycle/docker"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
)

// Network is the bridge network harnesses use (never airlock0, so that tests do not
// touch a real installation's network). Each test package sets its own in TestMain so
// packages running in parallel do not share one.
var Network = "altest-lc0"

// NamePrefix starts the names of every container the tests create.
const NamePrefix = "altest-lc-"

var (
	buildOnce sync.Once
	execdPath string
	buildErr  error
)

// ModuleRoot returns the directory of go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Execd returns a static execd binary: $AIRLOCK_TEST_EXECD when set, else one built
// from ./cmd/execd with CGO_ENABLED=0 (once per test process).
func Execd(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AIRLOCK_TEST_EXECD"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := processTempDir("airlock-execd-")
		if err != nil {
			buildErr = err
			return
		}
		execdPath = filepath.Join(dir, "execd")
		cmd := exec.Command("go", "build", "-o", execdPath, "./cmd/execd")
		cmd.Dir = ModuleRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building execd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return execdPath
}

// Docker returns an engine client closed at the end of the test.
func Docker(t testing.TB) *client.Client {
	t.Helper()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Options tune a Harness.
type Options struct {
	APIKey           string
	Limits           lifecycle.Limits
	AllowedHostRoots []string
	// StateDir reuses a store directory (restart tests); default a new temp dir.
	StateDir       string
	ReapInterval   time.Duration
	ResyncInterval time.Duration
	// Endpoint replaces the server-proxy endpoints (the gateway's hook).
	Endpoint lifecycle.EndpointFunc
	// KeepContainers leaves the containers in place at cleanup (the next harness on the
	// same StateDir adopts them and cleans up).
	KeepContainers bool
	// DNSOnGateway makes the network's gateway address the sandboxes' only resolver
	// (where an egressd under test serves its DNS filter).
	DNSOnGateway bool
	// Audit and AuditDir are passed to lifecycle.Config (policy-change records, the
	// audit query route).
	Audit    interface{ Append(audit.Record) }
	AuditDir string
	// DefaultAccess and GatewayKey are passed to lifecycle.Config.
	DefaultAccess watch.AccessMode
	GatewayKey    string
	// CredentialVault is passed to lifecycle.Config (credentialProxy sandboxes).
	CredentialVault lifecycle.CredentialVault
	// ReadyGate is passed to lifecycle.Config (an egressd under test confirms
	// enforcement before a sandbox's entrypoint is released).
	ReadyGate func(id string) bool
	// Subnet6 gives the harness network IPv6 (docker.Config.Subnet6): dual-stack
	// sandboxes.
	Subnet6 netip.Prefix
	// PolicyGate is passed to lifecycle.Config (policy changes answer once enforced).
	PolicyGate func(id string, version uint64) bool
	// Pools and ImageAliases are passed to lifecycle.Config (warm pools; image names
	// served by other local images).
	Pools        []lifecycle.PoolSpec
	ImageAliases map[string]string
	// Library is passed to lifecycle.Config (named policies).
	Library lifecycle.PolicyLibrary
	// OCIRuntime is docker.Config.OCIRuntime, the engine runtime of every sandbox;
	// default $AIRLOCK_TEST_DOCKER_RUNTIME (runsc runs a package's suite on gVisor),
	// else the engine's default.
	OCIRuntime string
	// Snapshots is passed to lifecycle.Config (snapshot limits).
	Snapshots lifecycle.SnapshotLimits
	// Floor is passed to lifecycle.Config (the overlay policy proposals leave out).
	Floor *policies.Overlay
}

// Harness is a lifecycle server on the real Docker engine, served by an httptest
// server.
type Harness struct {
	Server   *lifecycle.Server
	Runtime  *docker.Runtime
	Store    *boltstore.Store
	HTTP     *httptest.Server
	StateDir string
	Image    string
	stopped  bool
	opts     Options
	t        testing.TB
}

// New starts a Harness; it skips (or fails under AIRLOCK_REQUIRE_PRIVILEGED=1) without
// Docker and the default image. Cleanup removes every container the server made.
func New(t testing.TB, o Options) *Harness {
	t.Helper()
	img := testenv.NeedSandboxImage(t)
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	store, err := boltstore.Open(filepath.Join(o.StateDir, "lifecycle.db"))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := store.InstanceID()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := docker.New(docker.Config{
		Client:           Docker(t),
		Instance:         inst,
		Network:          Network,
		ExecdPath:        Execd(t),
		AllowedHostRoots: o.AllowedHostRoots,
		NamePrefix:       NamePrefix,
		DNSOnGateway:     o.DNSOnGateway,
		Subnet6:          o.Subnet6,
		OCIRuntime:       cmp.Or(o.OCIRuntime, os.Getenv("AIRLOCK_TEST_DOCKER_RUNTIME")),
		Log:              serverLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	// The execd key lives with the state, like airlock up's, so that a restarted server
	// still reaches the sandboxes it adopts.
	execdKey, err := execdtoken.LoadOrCreate(filepath.Join(o.StateDir, "execd-key"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := lifecycle.New(lifecycle.Config{
		ExecdKey:        execdKey,
		Log:             serverLog,
		Runtime:         rt,
		Store:           store,
		APIKey:          o.APIKey,
		Limits:          o.Limits,
		ReapInterval:    o.ReapInterval,
		ResyncInterval:  o.ResyncInterval,
		ReadyTimeout:    60 * time.Second,
		Endpoint:        o.Endpoint,
		Audit:           o.Audit,
		AuditDir:        o.AuditDir,
		DefaultAccess:   o.DefaultAccess,
		GatewayKey:      o.GatewayKey,
		CredentialVault: o.CredentialVault,
		ReadyGate:       o.ReadyGate,
		PolicyGate:      o.PolicyGate,
		Pools:           o.Pools,
		ImageAliases:    o.ImageAliases,
		Library:         o.Library,
		Snapshots:       o.Snapshots,
		Floor:           o.Floor,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := &Harness{Server: srv, Runtime: rt, Store: store, StateDir: o.StateDir, Image: img, opts: o, t: t}
	h.HTTP = httptest.NewServer(srv.Handler())
	t.Cleanup(h.Stop)
	return h
}

// Stop shuts the server down (once) and, unless KeepContainers, removes every container
// it made.
func (h *Harness) Stop() {
	if h.stopped {
		return
	}
	h.stopped = true
	h.HTTP.Close()
	h.Server.Close()
	if !h.opts.KeepContainers {
		RemoveAll(h.t, h.Runtime)
	}
	h.Store.Close()
}

// RemoveAll removes every container of rt's instance.
func RemoveAll(t testing.TB, rt *docker.Runtime) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	insts, err := rt.List(ctx)
	if err != nil {
		t.Errorf("listing containers for cleanup: %v", err)
		return
	}
	for _, in := range insts {
		if err := rt.Remove(ctx, in); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

var (
	airlockOnce sync.Once
	airlockPath string
	airlockErr  error
)

// Airlock returns the airlock binary built from ./cmd/airlock (once per test process),
// with execd beside it (the default execd path of `airlock up`).
func Airlock(t testing.TB) string {
	t.Helper()
	execd := Execd(t)
	airlockOnce.Do(func() {
		dir, err := processTempDir("airlock-bin-")
		if err != nil {
			airlockErr = err
			return
		}
		airlockPath = filepath.Join(dir, "airlock")
		cmd := exec.Command("go", "build", "-o", airlockPath, "./cmd/airlock")
		cmd.Dir = ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			airlockErr = fmt.Errorf("building airlock: %v\n%s", err, out)
			return
		}
		b, err := os.ReadFile(execd)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "execd"), b, 0o755)
		}
		airlockErr = err
	})
	if airlockErr != nil {
		t.Fatal(airlockErr)
	}
	return airlockPath
}

// serverLog shows the harness's warnings and errors on stderr (which go test prints
// for a failing package): a 500 in a test then says why.
var serverLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// RemoveNetwork removes the test network name when it exists and is unused; for
// TestMain after m.Run. In the inner loop (go test -short) no test created one and it
// does nothing: make check never talks to Docker.
func RemoveNetwork(name string) {
	if flag.Parsed() && testing.Short() {
		return
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = cli.NetworkRemove(ctx, name, client.NetworkRemoveOptions{})
}

// processTempDir makes a temporary directory named prefix, this process's pid and a
// random suffix, for binaries built once per test process, and first removes the
// directories of the same prefix whose process is gone: a test process cannot remove
// its own at exit, and each holds up to 155 MB (the airlock binary and execd).
func processTempDir(prefix string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range old {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), prefix), "-")
		if !ok || pid == "" || strings.Trim(pid, "0123456789") != "" {
			continue // not of this naming (an older one, or another tool's)
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); os.IsNotExist(err) {
			os.RemoveAll(dir)
		}
	}
	return os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
}
