package doctor

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/google/nftables"
	"github.com/moby/moby/client"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config is what `airlock up` would use (the same configuration file and flags) plus
// the host facts.
type Config struct {
	// StateDir must be writable; default /var/lib/airlock.
	StateDir string
	// Listen and GatewayListen must be free ("host:port"; port 0 is always fine).
	// GatewayListen is skipped when empty.
	Listen, GatewayListen string
	// Network is the Docker bridge network (default airlock0); Subnet its configured
	// IPv4 subnet (invalid: Docker's choice).
	Network string
	Subnet  netip.Prefix
	// Egress says whether egress enforcement runs (then bpffs or nftables, and port 53
	// on the bridge, are needed).
	Egress bool
	// Image is the sandbox image to find; default airlock/sandbox:latest. RecipeHash,
	// when set, is the label value a current image carries (airlock.dev/image-recipe).
	Image, RecipeHash string
	// AuditDir is the audit log's directory; its row (disk use against retention and
	// free space) is skipped when empty. AuditMaxBytes and AuditMaxAge are its
	// retention (audit.retention; 0: none).
	AuditDir      string
	AuditMaxBytes int64
	AuditMaxAge   time.Duration
	// Host supplies the facts; zero fields read this host.
	Host Host
}

// Docker is the part of the Docker Engine client the checks use.
type Docker interface {
	ServerVersion(ctx context.Context, o client.ServerVersionOptions) (client.ServerVersionResult, error)
	NetworkInspect(ctx context.Context, id string, o client.NetworkInspectOptions) (client.NetworkInspectResult, error)
	ImageInspect(ctx context.Context, ref string, o ...client.ImageInspectOption) (client.ImageInspectResult, error)
}

// Route is a host route: its destination and the interface it leaves by.
type Route struct {
	Dst netip.Prefix
	Dev string
}

// Host supplies the facts the checks read. A nil function reads this host.
type Host struct {
	Euid          func() int
	KernelRelease func() string
	// BTFPath and MountsPath default to /sys/kernel/btf/vmlinux and /proc/self/mounts.
	BTFPath, MountsPath string
	// SchedCLS probes for TC BPF programs (clsact); nil error when available.
	SchedCLS func() error
	// NFTables lists the tables over netlink; nil error when usable.
	NFTables func() error
	// Docker is the engine client; nil connects with client.FromEnv. DockerErr, when
	// set, is the connection error to report instead.
	Docker    Docker
	DockerErr error
	// Routes lists the host's IPv4 routes.
	Routes func() ([]Route, error)
	// Listen binds network ("tcp", "udp") addr and returns what to close.
	Listen func(network, addr string) (io.Closer, error)
	// NodeVersion runs `node --version`.
	NodeVersion func() (string, error)
}

func (c *Config) setDefaults() {
	if c.StateDir == "" {
		c.StateDir = "/var/lib/airlock"
	}
	if c.Network == "" {
		c.Network = "airlock0"
	}
	if c.Image == "" {
		c.Image = "airlock/sandbox:latest"
	}
	h := &c.Host
	if h.Euid == nil {
		h.Euid = os.Geteuid
	}
	if h.KernelRelease == nil {
		h.KernelRelease = kernelRelease
	}
	if h.BTFPath == "" {
		h.BTFPath = "/sys/kernel/btf/vmlinux"
	}
	if h.MountsPath == "" {
		h.MountsPath = "/proc/self/mounts"
	}
	if h.SchedCLS == nil {
		h.SchedCLS = func() error { return features.HaveProgramType(ebpf.SchedCLS) }
	}
	if h.NFTables == nil {
		h.NFTables = listTables
	}
	if h.Docker == nil && h.DockerErr == nil {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			h.DockerErr = err
		} else {
			h.Docker = cli
		}
	}
	if h.Routes == nil {
		h.Routes = hostRoutes
	}
	if h.Listen == nil {
		h.Listen = listen
	}
	if h.NodeVersion == nil {
		h.NodeVersion = func() (string, error) {
			out, err := exec.Command("node", "--version").Output()
			return strings.TrimSpace(string(out)), err
		}
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func listTables() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	defer conn.CloseLasting()
	_, err = conn.ListTables()
	return err
}

func hostRoutes() ([]Route, error) {
	rs, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []Route
	for _, r := range rs {
		if r.Dst == nil {
			continue // a default route (clashes with nothing)
		}
		p, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		dev := ""
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		out = append(out, Route{Dst: netip.PrefixFrom(p.Unmap(), ones), Dev: dev})
	}
	return out, nil
}

func listen(network, addr string) (io.Closer, error) {
	if network == "udp" {
		return net.ListenPacket("udp", addr)
	}
	return net.Listen("tcp", addr)
}
