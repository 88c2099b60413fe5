package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/testenv"
)

// fakeDocker is an engine with a version, maybe the network and maybe the image.
type fakeDocker struct {
	version, api string
	versionErr   error
	subnet       netip.Prefix // the network exists when valid
	gateway      netip.Addr
	imageLabel   string // the image exists when set
}

func (f *fakeDocker) ServerVersion(context.Context, client.ServerVersionOptions) (client.ServerVersionResult, error) {
	return client.ServerVersionResult{Version: f.version, APIVersion: f.api}, f.versionErr
}

func (f *fakeDocker) NetworkInspect(context.Context, string, client.NetworkInspectOptions) (client.NetworkInspectResult, error) {
	if !f.subnet.IsValid() {
		return client.NetworkInspectResult{}, errors.New("network not found")
	}
	var res client.NetworkInspectResult
	res.Network.IPAM.Config = []network.IPAMConfig{{Subnet: f.subnet, Gateway: f.gateway}}
	return res, nil
}

func (f *fakeDocker) ImageInspect(context.Context, string, ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	if f.imageLabel == "" {
		return client.ImageInspectResult{}, errors.New("no such image")
	}
	cfg := &dockerspec.DockerOCIImageConfig{}
	cfg.Labels = map[string]string{"airlock.dev/image-recipe": f.imageLabel}
	return client.ImageInspectResult{InspectResponse: image.InspectResponse{Config: cfg}}, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// healthy is a host where every check passes; tests break one fact each.
func healthy(t *testing.T) (Config, *fakeDocker) {
	t.Helper()
	dir := t.TempDir()
	btf := filepath.Join(dir, "vmlinux")
	mounts := filepath.Join(dir, "mounts")
	must(t, os.WriteFile(btf, nil, 0o644))
	must(t, os.WriteFile(mounts, []byte("bpf /sys/fs/bpf bpf rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"), 0o644))
	d := &fakeDocker{version: "24.0.7", api: "1.43", subnet: netip.MustParsePrefix("10.213.0.0/16"),
		gateway: netip.MustParseAddr("10.213.0.1"), imageLabel: "recipe1"}
	return Config{
		StateDir:      filepath.Join(dir, "state"),
		Listen:        "127.0.0.1:8080",
		GatewayListen: "127.0.0.1:8081",
		Network:       "airlock0",
		Egress:        true,
		RecipeHash:    "recipe1",
		Host: Host{
			Euid:          func() int { return 0 },
			KernelRelease: func() string { return "6.8.0" },
			BTFPath:       btf,
			MountsPath:    mounts,
			SchedCLS:      func() error { return nil },
			NFTables:      func() error { return nil },
			Docker:        d,
			Routes: func() ([]Route, error) {
				return []Route{{Dst: netip.MustParsePrefix("10.213.0.0/16"), Dev: "airlock0"},
					{Dst: netip.MustParsePrefix("192.0.2.0/24"), Dev: "eth0"}}, nil
			},
			Listen:      func(string, string) (io.Closer, error) { return nopCloser{}, nil },
			NodeVersion: func() (string, error) { return "v20.11.0", nil },
		},
	}, d
}

func TestHealthyHost(t *testing.T) {
	cfg, _ := healthy(t)
	rep := Run(context.Background(), cfg)
	if !rep.OK || rep.Err() != nil {
		t.Fatalf("healthy host not ok: %v", rep.Err())
	}
	for _, row := range rep.Rows {
		if row.Status != OK {
			t.Errorf("row %q: %s (%s)", row.Check, row.Status, row.Detail)
		}
	}
	if r, _ := rep.Row("TCX or clsact"); !strings.Contains(r.Detail, "TCX") {
		t.Errorf("kernel 6.8 has TCX: %q", r.Detail)
	}
}

// TestEachRowFails breaks one fact per case: the named row reports it with a fix, and
// the report is not OK exactly when that row is hard.
func TestEachRowFails(t *testing.T) {
	tests := []struct {
		name   string
		breaks func(t *testing.T, c *Config, d *fakeDocker)
		row    string
		status Status
		hard   bool
		fix    string // a substring of the fix
	}{
		{"not_root", func(_ *testing.T, c *Config, _ *fakeDocker) { c.Host.Euid = func() int { return 1000 } },
			"root", Missing, true, "run as root"},
		{"no_btf", func(_ *testing.T, c *Config, _ *fakeDocker) { c.Host.BTFPath = "/nonexistent/vmlinux" },
			"kernel and BTF", Degraded, false, "CONFIG_DEBUG_INFO_BTF"},
		{"no_bpffs", func(t *testing.T, c *Config, _ *fakeDocker) {
			must(t, os.WriteFile(c.Host.MountsPath, []byte("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"), 0o644))
		}, "bpffs", Missing, true, "mount -t bpf bpf /sys/fs/bpf"},
		{"no_tc_bpf", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.SchedCLS = func() error { return errors.New("not supported") }
		}, "TCX or clsact", Degraded, false, "nftables"},
		{"no_cgroup2", func(t *testing.T, c *Config, _ *fakeDocker) {
			must(t, os.WriteFile(c.Host.MountsPath, []byte("bpf /sys/fs/bpf bpf rw 0 0\n"), 0o644))
		}, "cgroup v2", Degraded, false, "cgroup2"},
		{"no_nftables_with_ebpf", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.NFTables = func() error { return errors.New("protocol not supported") }
		}, "nftables (netlink)", Missing, false, "nf_tables"},
		{"no_nftables_no_ebpf", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.NFTables = func() error { return errors.New("protocol not supported") }
			c.Host.BTFPath = "/nonexistent/vmlinux"
		}, "nftables (netlink)", Missing, true, "nf_tables"},
		{"docker_unreachable", func(_ *testing.T, _ *Config, d *fakeDocker) {
			d.versionErr = errors.New("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
		}, "docker engine", Missing, true, "prepare.sh"},
		{"docker_too_old", func(_ *testing.T, _ *Config, d *fakeDocker) { d.version, d.api = "18.09", "1.39" },
			"docker engine", Missing, true, "19.03"},
		{"network_clash", func(_ *testing.T, c *Config, _ *fakeDocker) {
			routes := []Route{{Dst: netip.MustParsePrefix("10.213.5.0/24"), Dev: "wg0"}}
			c.Host.Routes = func() ([]Route, error) { return routes, nil }
		}, "network airlock0", Missing, true, "docker.subnet"},
		{"configured_subnet_clash", func(_ *testing.T, c *Config, d *fakeDocker) {
			d.subnet = netip.Prefix{}
			c.Subnet = netip.MustParsePrefix("192.0.2.0/25")
		}, "network airlock0", Missing, true, "docker.subnet"},
		{"api_port_taken", func(t *testing.T, c *Config, _ *fakeDocker) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			must(t, err)
			t.Cleanup(func() { ln.Close() })
			c.Listen = ln.Addr().String()
			c.Host.Listen = listen // the real bind
		}, "port: lifecycle API", Missing, true, "airlock down"},
		{"gateway_port_taken", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.Listen = func(_, addr string) (io.Closer, error) {
				if addr == "127.0.0.1:8081" {
					return nil, errors.New("address already in use")
				}
				return nopCloser{}, nil
			}
		}, "port: gateway", Missing, true, "gateway.listen"},
		{"dns_port_taken", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.Listen = func(network, addr string) (io.Closer, error) {
				if network == "udp" && addr == "10.213.0.1:53" {
					return nil, errors.New("address already in use")
				}
				return nopCloser{}, nil
			}
		}, "port: DNS on the bridge", Missing, true, "10.213.0.1:53"},
		{"image_absent", func(_ *testing.T, _ *Config, d *fakeDocker) { d.imageLabel = "" },
			"sandbox image", Degraded, false, "airlock image build"},
		{"image_stale", func(_ *testing.T, _ *Config, d *fakeDocker) { d.imageLabel = "old-recipe" },
			"sandbox image", Degraded, false, "airlock image build"},
		{"state_dir_not_a_directory", func(t *testing.T, c *Config, _ *fakeDocker) {
			file := filepath.Join(t.TempDir(), "file")
			must(t, os.WriteFile(file, nil, 0o644))
			c.StateDir = filepath.Join(file, "state")
		}, "state directory", Missing, true, "stateDir"},
		{"no_node", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.NodeVersion = func() (string, error) { return "", errors.New("not found") }
		}, "node (SDK tests only)", Degraded, false, "nodejs"},
		{"old_node", func(_ *testing.T, c *Config, _ *fakeDocker) {
			c.Host.NodeVersion = func() (string, error) { return "v18.19.0", nil }
		}, "node (SDK tests only)", Degraded, false, "Node 20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, d := healthy(t)
			tc.breaks(t, &cfg, d)
			rep := Run(context.Background(), cfg)
			row, ok := rep.Row(tc.row)
			if !ok {
				t.Fatalf("no row %q", tc.row)
			}
			if row.Status != tc.status || row.Hard != tc.hard || !strings.Contains(row.Fix, tc.fix) {
				t.Errorf("row %q = %s hard=%v fix %q (%s); want %s hard=%v fix containing %q",
					tc.row, row.Status, row.Hard, row.Fix, row.Detail, tc.status, tc.hard, tc.fix)
			}
			if rep.OK == tc.hard {
				t.Errorf("report OK = %v with a failing row of hard=%v", rep.OK, tc.hard)
			}
			err := rep.Err()
			if tc.hard != (err != nil) {
				t.Fatalf("Err() = %v for hard=%v", err, tc.hard)
			}
			if err != nil && (!errors.Is(err, ErrHostNotReady) || !strings.Contains(err.Error(), tc.fix)) {
				t.Errorf("Err() %q does not name the fix %q", err, tc.fix)
			}
			var table bytes.Buffer
			must(t, rep.WriteTable(&table))
			if tc.hard && !strings.Contains(table.String(), "(hard)") {
				t.Errorf("table does not mark the hard row:\n%s", table.String())
			}
		})
	}
}

func TestNoEgressNeedsNoBPFFS(t *testing.T) {
	cfg, _ := healthy(t)
	cfg.Egress = false
	must(t, os.WriteFile(cfg.Host.MountsPath, []byte("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"), 0o644))
	if rep := Run(context.Background(), cfg); !rep.OK {
		t.Errorf("--no-egress host without bpffs is refused: %v", rep.Err())
	}
}

func TestJSON(t *testing.T) {
	cfg, _ := healthy(t)
	cfg.Host.Euid = func() int { return 1000 }
	var b bytes.Buffer
	must(t, Run(context.Background(), cfg).WriteJSON(&b))
	var got struct {
		Rows []Row `json:"rows"`
		OK   bool  `json:"ok"`
	}
	must(t, json.Unmarshal(b.Bytes(), &got))
	if got.OK || len(got.Rows) < 12 || got.Rows[0].Check != "root" || got.Rows[0].Status != Missing {
		t.Errorf("JSON report: %s", b.String())
	}
}

// TestThisHost runs every check against this machine's real kernel, mounts, netlink and
// Docker engine, with free ports and a network of the test's own name.
func TestThisHost(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedDocker(t)
	rep := Run(context.Background(), Config{
		StateDir: t.TempDir(), Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0",
		Network: "altest-doctor0", Egress: true,
	})
	if err := rep.Err(); err != nil {
		var b bytes.Buffer
		rep.WriteTable(&b)
		t.Fatalf("%v\n%s", err, b.String())
	}
	if r, _ := rep.Row("docker engine"); r.Status != OK || !strings.Contains(r.Detail, "API 1.") {
		t.Errorf("docker row: %+v", r)
	}
	if r, _ := rep.Row("nftables (netlink)"); r.Status != OK {
		t.Errorf("nftables over netlink should work as root here: %+v", r)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
