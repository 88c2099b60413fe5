package egressd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/boltstore"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// fleetRuntime is a lifecycle.Runtime whose sandboxes are veth pairs of the host (made
// by the benchmark, never up) with loopback addresses, where one fake execd answers: a
// thousand sandboxes for the control plane and the real eBPF datapath without a
// thousand containers.
type fleetRuntime struct {
	mu   sync.Mutex
	next int
	byID map[string]lifecycle.Instance
}

func (f *fleetRuntime) Kind() string { return "fleet" }

func (f *fleetRuntime) Create(_ context.Context, s lifecycle.Spec) (lifecycle.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.next
	f.next++
	in := lifecycle.Instance{SandboxID: s.SandboxID, ContainerID: "fleet-" + s.SandboxID,
		Address:       netip.AddrFrom4([4]byte{127, 77, byte(i / 250), byte(i%250 + 1)}),
		HostInterface: fleetIfname(i), Phase: lifecycle.PhaseRunning}
	f.byID[in.ContainerID] = in
	return in, nil
}

func fleetIfname(i int) string { return "alfleet" + strconv.Itoa(i) }

func (f *fleetRuntime) Remove(_ context.Context, in lifecycle.Instance) error {
	f.mu.Lock()
	delete(f.byID, in.ContainerID)
	f.mu.Unlock()
	return nil
}
func (f *fleetRuntime) Pause(context.Context, string) error  { return nil }
func (f *fleetRuntime) Resume(context.Context, string) error { return nil }
func (f *fleetRuntime) Inspect(_ context.Context, cid string) (lifecycle.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.byID[cid]
	if !ok {
		return in, lifecycle.ErrInstanceGone
	}
	return in, nil
}
func (f *fleetRuntime) List(context.Context) ([]lifecycle.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]lifecycle.Instance, 0, len(f.byID))
	for _, in := range f.byID {
		out = append(out, in)
	}
	return out, nil
}

// TestBenchNamedPolicyPropagation measures, for 1000 sandboxes under one named policy,
// the time from saving an edit of its file to every sandbox's datapath enforcing the new
// version: fsnotify and the library's debounce (20 ms), lifecycle republishing, the
// watch stream, egressd batching (one compile per policy, one kernel grace period per
// batch: batch.go) and updating the real eBPF maps of each sandbox.
func TestBenchNamedPolicyPropagation(t *testing.T) {
	testenv.NeedBench(t)
	testenv.NeedBPF(t)
	const n, rounds = 1000, 5
	for i := range n {
		name := fleetIfname(i)
		link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
		_ = netlink.LinkDel(link) // a leftover
		if err := netlink.LinkAdd(link); err != nil {
			t.Fatalf("veth %s: %v", name, err)
		}
		t.Cleanup(func() { netlink.LinkDel(link) })
	}
	// The fake execd: answers the readiness probe and the release, from loopback only.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || !ap.Addr().IsLoopback() {
			http.Error(w, "loopback only", http.StatusForbidden)
			return
		}
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusNoContent)
		}
	})}
	go fake.Serve(ln)
	t.Cleanup(func() { fake.Close() })

	dir := t.TempDir()
	file := filepath.Join(dir, "bulk.yaml")
	edit := func(k int) {
		tmp := file + ".tmp"
		body := fmt.Sprintf("defaultAction: deny\negress:\n  - action: allow\n    target: edit%d.test\n  - action: allow\n    target: pypi.org\n", k)
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	edit(0)
	var srv *lifecycle.Server
	var srvMu sync.Mutex
	lib, err := library.Open(library.Config{Dir: dir, OnEvent: func(ev library.Event) {
		srvMu.Lock()
		defer srvMu.Unlock()
		if ev.Applied && srv != nil {
			srv.NamedPolicyChanged(ev.Name)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	var current *Daemon
	var curMu sync.Mutex
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "lifecycle.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	srvMu.Lock()
	srv, err = lifecycle.New(lifecycle.Config{
		Runtime: &fleetRuntime{byID: map[string]lifecycle.Instance{}}, Store: store, Library: lib,
		ExecdPort: ln.Addr().(*net.TCPAddr).Port,
		ReadyGate: func(id string) bool {
			curMu.Lock()
			defer curMu.Unlock()
			return current != nil && current.Enforced(id)
		},
	})
	srvMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	api := httptest.NewServer(srv.Handler())
	t.Cleanup(api.Close)

	d, err := New(Config{
		Watch:     watch.ClientConfig{URL: api.URL + "/internal/v1/watch"},
		Enforcer:  enforcer.Config{Mode: enforcer.ModeEBPF, EBPF: EBPFBackend(pinRoot(t))},
		DNSListen: "127.0.0.1:0",
		Resolver:  netip.MustParseAddr("127.0.0.1"),
		Upstreams: []string{"127.0.0.1:1"},
		Overlay:   policies.BaseOverlay(),
		Registry:  prometheus.NewRegistry(),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	curMu.Lock()
	current = d
	curMu.Unlock()
	libCtx, libCancel := context.WithCancel(context.Background())
	libDone := make(chan struct{})
	go func() { defer close(libDone); lib.Run(libCtx) }()
	t.Cleanup(func() { libCancel(); <-libDone })

	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := srv.Create(context.Background(), &lifecycle.CreateRequest{
				Image: &lifecycle.ImageSpec{URI: "fleet"}, Entrypoint: []string{"true"},
				Extensions: map[string]string{lifecycle.ExtPolicy: "bulk"},
			})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = sb.ID
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	waitAll := func(version uint64, limit time.Duration) bool {
		deadline := time.Now().Add(limit)
		for {
			ok := 0
			for _, id := range ids {
				if v, att := d.EnforcedVersion(id); att && v >= version {
					ok++
				}
			}
			if ok == n {
				return true
			}
			if time.Now().After(deadline) {
				t.Logf("%d of %d sandboxes at version %d", ok, n, version)
				return false
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	if !waitAll(2, 2*time.Minute) {
		t.Fatal("the fleet was never enforced")
	}
	s := benchreport.Sample{Name: fmt.Sprintf("named_policy_edit_to_enforced_%d_sandboxes", n)}
	for k := 1; k <= rounds; k++ {
		t0 := time.Now()
		edit(k)
		if !waitAll(uint64(2+k), 30*time.Second) {
			t.Fatalf("edit %d not enforced everywhere", k)
		}
		lat := time.Since(t0)
		s.Latencies = append(s.Latencies, lat)
		s.Wall += lat
		time.Sleep(100 * time.Millisecond)
	}
	benchreport.Print(benchSuite, s)
	benchreport.Ratio(benchSuite, fmt.Sprintf("named policy edit to enforced at %d sandboxes p50 ms", n), float64(s.Quantile(0.5))/float64(time.Millisecond), "≤", 100)
	benchreport.Ratio(benchSuite, fmt.Sprintf("named policy edit to enforced at %d sandboxes p99 ms", n), float64(s.Quantile(0.99))/float64(time.Millisecond), "≤", 0)
}
