package doctor

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// minDockerAPI is the oldest engine API the Go client (github.com/moby/moby/client
// MinAPIVersion) talks to: Docker 19.03.
const minDockerAPI = "1.40"

const prepareFix = "deploy/host/prepare.sh (or make prepare)"

type checker struct {
	cfg Config
	h   Host

	mounts       []mount // read once
	mountsErr    error
	dockerOK     bool
	bridgeGW     netip.Addr // the network's IPv4 gateway, when it exists
	btfOK, clsOK bool
}

type mount struct{ dir, fstype string }

func (c *checker) readMounts() ([]mount, error) {
	if c.mounts != nil || c.mountsErr != nil {
		return c.mounts, c.mountsErr
	}
	f, err := os.Open(c.h.MountsPath)
	if err != nil {
		c.mountsErr = err
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 {
			c.mounts = append(c.mounts, mount{dir: fs[1], fstype: fs[2]})
		}
	}
	if c.mounts == nil {
		c.mounts = []mount{}
	}
	return c.mounts, sc.Err()
}

func (c *checker) root() Row {
	r := Row{Check: "root", Hard: true}
	if c.h.Euid() == 0 {
		r.Status, r.Detail = OK, "running as root"
		return r
	}
	r.Status, r.Detail = Missing, fmt.Sprintf("euid %d", c.h.Euid())
	r.Fix = "run as root (Docker, eBPF and nftables need it): sudo airlock ..."
	return r
}

func (c *checker) kernel() Row {
	r := Row{Check: "kernel and BTF", Status: OK}
	rel := c.h.KernelRelease()
	if _, err := os.Stat(c.h.BTFPath); err != nil {
		r.Status = Degraded
		r.Detail = fmt.Sprintf("%s, no BTF at %s", rel, c.h.BTFPath)
		r.Fix = "a kernel built with CONFIG_DEBUG_INFO_BTF=y; until then egress uses the nftables datapath"
		return r
	}
	c.btfOK = true
	r.Detail = rel + ", BTF present"
	return r
}

func (c *checker) bpffs() Row {
	r := Row{Check: "bpffs", Hard: c.cfg.Egress}
	ms, err := c.readMounts()
	if err != nil {
		r.Status, r.Detail, r.Fix = Missing, "cannot read the mount table: "+err.Error(), "mount /proc"
		return r
	}
	for _, m := range ms {
		if m.dir == "/sys/fs/bpf" && m.fstype == "bpf" {
			r.Status, r.Detail = OK, "mounted on /sys/fs/bpf"
			return r
		}
	}
	r.Status, r.Detail = Missing, "/sys/fs/bpf is not a bpf mount (pinned enforcement state cannot survive a restart)"
	r.Fix = "mount -t bpf bpf /sys/fs/bpf"
	return r
}

func (c *checker) tcHook() Row {
	r := Row{Check: "TCX or clsact"}
	if err := c.h.SchedCLS(); err != nil {
		r.Status, r.Detail = Degraded, "TC BPF programs unavailable: "+err.Error()
		r.Fix = "a kernel with CONFIG_NET_CLS_BPF and CONFIG_NET_SCH_INGRESS; until then egress uses nftables"
		return r
	}
	c.clsOK = true
	rel := c.h.KernelRelease()
	if kernelAtLeast(rel, 6, 6) {
		r.Status, r.Detail = OK, "TCX (kernel "+rel+")"
	} else {
		r.Status, r.Detail = OK, "clsact (TCX needs kernel 6.6)"
	}
	return r
}

func (c *checker) cgroup2() Row {
	r := Row{Check: "cgroup v2"}
	ms, _ := c.readMounts()
	hybrid := false
	for _, m := range ms {
		if m.fstype == "cgroup" {
			hybrid = true
		}
	}
	for _, m := range ms {
		if m.fstype == "cgroup2" {
			r.Status, r.Detail = OK, "mounted on "+m.dir
			if hybrid {
				r.Detail += " (hybrid: cgroup v1 controllers too)"
			}
			return r
		}
	}
	r.Status, r.Detail = Degraded, "no cgroup2 mount"
	r.Fix = "mount -t cgroup2 none /sys/fs/cgroup (or boot with systemd.unified_cgroup_hierarchy=1)"
	return r
}

func (c *checker) nftables() Row {
	// Hard only when it is the only datapath left.
	r := Row{Check: "nftables (netlink)", Hard: c.cfg.Egress && !(c.btfOK && c.clsOK)}
	if err := c.h.NFTables(); err != nil {
		r.Status, r.Detail = Missing, "listing tables over netlink failed: "+err.Error()
		r.Fix = "modprobe nf_tables (a kernel with CONFIG_NF_TABLES); needed where eBPF cannot attach"
		return r
	}
	r.Status, r.Detail = OK, "usable"
	return r
}

func (c *checker) docker(ctx context.Context) Row {
	r := Row{Check: "docker engine", Hard: true}
	if c.h.DockerErr != nil {
		r.Status, r.Detail, r.Fix = Missing, c.h.DockerErr.Error(), prepareFix
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := c.h.Docker.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		r.Status, r.Detail = Missing, "not reachable: "+firstLine(err.Error())
		r.Fix = prepareFix + " installs docker.io and starts dockerd"
		return r
	}
	r.Detail = fmt.Sprintf("%s, API %s", v.Version, v.APIVersion)
	if versionLess(v.APIVersion, minDockerAPI) {
		r.Status = Missing
		r.Fix = "Docker 19.03 or newer (engine API " + minDockerAPI + "): apt-get install docker.io"
		return r
	}
	r.Status = OK
	c.dockerOK = true
	return r
}

func (c *checker) network(ctx context.Context) Row {
	r := Row{Check: "network " + c.cfg.Network, Hard: true}
	if !c.dockerOK {
		r.Status, r.Detail, r.Fix = Missing, "not checked: the engine does not answer", prepareFix
		return r
	}
	subnet := c.cfg.Subnet
	res, err := c.h.Docker.NetworkInspect(ctx, c.cfg.Network, client.NetworkInspectOptions{})
	exists := err == nil
	if exists {
		for _, ic := range res.Network.IPAM.Config {
			if ic.Subnet.Addr().Is4() {
				subnet, c.bridgeGW = ic.Subnet.Masked(), ic.Gateway
				if !c.bridgeGW.IsValid() { // the engine's default, unreported by Docker 20.10
					c.bridgeGW = subnet.Addr().Next()
				}
			}
		}
	}
	routes, rerr := c.h.Routes()
	if rerr != nil {
		r.Status, r.Detail, r.Fix = Degraded, "cannot list host routes: "+rerr.Error(), "check `ip route`"
		return r
	}
	if subnet.IsValid() {
		for _, rt := range routes {
			if rt.Dev != c.cfg.Network && rt.Dst.Bits() > 0 && rt.Dst.Overlaps(subnet) {
				r.Status = Missing
				r.Detail = fmt.Sprintf("subnet %s clashes with the host route %s dev %s", subnet, rt.Dst, rt.Dev)
				r.Fix = "set docker.subnet in /etc/airlock/airlock.yaml to a free prefix"
				if exists {
					r.Fix += fmt.Sprintf(" and remove the network (airlock down --purge, or docker network rm %s)", c.cfg.Network)
				}
				return r
			}
		}
	}
	r.Status = OK
	switch {
	case exists:
		r.Detail = fmt.Sprintf("exists, subnet %s, no clashing route", subnet)
	case subnet.IsValid():
		r.Detail = fmt.Sprintf("will be created with subnet %s (no clashing route)", subnet)
	default:
		r.Detail = "will be created (Docker picks a free subnet)"
	}
	return r
}

func (c *checker) ports() []Row {
	var rows []Row
	check := func(name, network, addr, fix string) {
		r := Row{Check: name, Hard: true}
		if _, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
			r.Status, r.Detail = OK, addr+" (any free port)"
			rows = append(rows, r)
			return
		}
		l, err := c.h.Listen(network, addr)
		if err != nil {
			r.Status, r.Detail = Missing, fmt.Sprintf("%s/%s is taken: %s", addr, network, firstLine(err.Error()))
			r.Fix = fix
		} else {
			l.Close()
			r.Status, r.Detail = OK, addr+"/"+network+" free"
		}
		rows = append(rows, r)
	}
	check("port: lifecycle API", "tcp", c.cfg.Listen, "stop what holds it (airlock down, or ss -ltnp) or set listen / --listen")
	if c.cfg.GatewayListen != "" {
		check("port: gateway", "tcp", c.cfg.GatewayListen, "stop what holds it (airlock down, or ss -ltnp) or set gateway.listen / --gateway-listen")
	}
	if c.cfg.Egress {
		if !c.bridgeGW.IsValid() {
			rows = append(rows, Row{Check: "port: DNS on the bridge", Status: OK, Hard: true,
				Detail: "checked once the network exists (egressd listens on its gateway, port 53)"})
		} else {
			addr := net.JoinHostPort(c.bridgeGW.String(), "53")
			fix := "stop the resolver bound to " + addr + " (another airlock up, dnsmasq: ss -lunp)"
			check("port: DNS on the bridge", "udp", addr, fix)
			check("port: DNS on the bridge (tcp)", "tcp", addr, fix)
		}
	}
	return rows
}

func (c *checker) image(ctx context.Context) Row {
	r := Row{Check: "sandbox image", Status: Degraded, Fix: "airlock image build (or make image)"}
	if !c.dockerOK {
		r.Detail = "not checked: the engine does not answer"
		return r
	}
	img, err := c.h.Docker.ImageInspect(ctx, c.cfg.Image)
	if err != nil {
		r.Detail = c.cfg.Image + " not present: sandbox creates with the default image fail"
		return r
	}
	var label string
	if img.Config != nil {
		label = img.Config.Labels["airlock.dev/image-recipe"]
	}
	if c.cfg.RecipeHash != "" && label != c.cfg.RecipeHash {
		r.Detail = fmt.Sprintf("%s is stale (recipe %.12s, this build's is %.12s)", c.cfg.Image, label, c.cfg.RecipeHash)
		return r
	}
	r.Status, r.Fix = OK, ""
	r.Detail = fmt.Sprintf("%s present (recipe %.12s)", c.cfg.Image, label)
	return r
}

func (c *checker) stateDir() Row {
	r := Row{Check: "state directory", Hard: true}
	dir := c.cfg.StateDir
	for {
		fi, err := os.Stat(dir)
		if err == nil && fi.IsDir() {
			break
		}
		if err == nil || !os.IsNotExist(err) || dir == "/" {
			r.Status, r.Detail = Missing, fmt.Sprintf("%s: not a directory", dir)
			r.Fix = "remove it or set stateDir / --state-dir"
			return r
		}
		parent := dir[:strings.LastIndex(dir, "/")]
		if parent == "" {
			parent = "/"
		}
		dir = parent
	}
	f, err := os.CreateTemp(dir, ".airlock-doctor-*")
	if err != nil {
		r.Status, r.Detail = Missing, fmt.Sprintf("%s is not writable: %v", dir, err)
		r.Fix = "run as root, or set stateDir / --state-dir to a writable directory"
		return r
	}
	f.Close()
	os.Remove(f.Name())
	r.Status = OK
	if dir == c.cfg.StateDir {
		r.Detail = dir + " writable"
	} else {
		r.Detail = fmt.Sprintf("%s will be created (%s writable)", c.cfg.StateDir, dir)
	}
	return r
}

func (c *checker) node() Row {
	r := Row{Check: "node (SDK tests only)", Fix: "apt-get install nodejs npm (Node 20 or newer)"}
	v, err := c.h.NodeVersion()
	if err != nil {
		r.Status, r.Detail = Degraded, "node not found"
		return r
	}
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 2)[0])
	if major < 20 {
		r.Status, r.Detail = Degraded, v+" is older than 20"
		return r
	}
	r.Status, r.Detail, r.Fix = OK, v, ""
	return r
}

// kernelAtLeast reports whether release ("6.18.44-fc") is major.minor or newer.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, _ := strconv.Atoi(parts[0])
	mi, _ := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return ma > major || (ma == major && mi >= minor)
}

// versionLess compares dotted versions ("1.41" < "1.40" is false).
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
