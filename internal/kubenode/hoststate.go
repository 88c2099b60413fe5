package kubenode

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// Sysctls are the kernel settings the node may change: kubelet's three (it sets
// vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1), up.sh's forwarding
// and bridge netfilter, and the ones kube-proxy would tune if its configuration let it.
var Sysctls = []string{
	"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops",
	"net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables",
	"net.ipv4.conf.all.route_localnet", "net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established", "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
	"net.netfilter.nf_conntrack_tcp_be_liberal",
}

// hostPaths are the host folders the node's components create outside StateDir and
// RunDir when they are missing.
var hostPaths = []string{StateDir, RunDir, "/var/lib/kubelet", "/var/lib/cni", "/var/log/containers", "/var/log/pods"}

// nodeChain matches the iptables chains of the node's components: kubelet's canaries,
// kube-proxy's, kube-router's, the CNI portmap plugin's and up.sh's own.
var nodeChain = regexp.MustCompile(`^(KUBE-|CNI-|AIRLOCK-KUBE-)`)

// HostState is what of the host the node touches, as Snapshot reads it.
type HostState struct {
	Sysctls   map[string]string // name -> value; a missing sysctl is absent
	Paths     map[string]bool   // hostPaths -> exists
	Cgroups   []string          // /sys/fs/cgroup/<controller>/kubepods folders
	Bridge    bool              // the CNI bridge exists
	Egressd   []string          // what Airlock's egressd on the node leaves: EgressdDNSInterface, EgressdPinRoot
	BPFShared bool              // /sys/fs/bpf is a shared mount (up.sh makes a private one shared)
	Chains    []string          // "<iptables|ip6tables> <table> <chain>" of nodeChain chains
	IPSets    []string          // KUBE-* and kube-router* ipsets
	NFTTables []string          // every nftables table, "<family> <name>"
	Mounts    []string          // mount points under StateDir, RunDir or /var/lib/kubelet
	Processes []string          // "<pid> <command line>" naming StateDir or RunDir
}

// Snapshot reads the host's state. It fails only when nftables cannot be listed; the
// iptables and ipset tools may be missing (nothing of theirs is there then).
func Snapshot() (HostState, error) {
	var s HostState
	s.Sysctls = map[string]string{}
	for _, k := range Sysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/"))); err == nil {
			s.Sysctls[k] = strings.TrimSpace(string(v))
		}
	}
	s.Paths = map[string]bool{}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s.Paths[p] = err == nil
	}
	s.Cgroups, _ = filepath.Glob("/sys/fs/cgroup/*/kubepods")
	_, err := os.Stat(filepath.Join("/sys/class/net", Bridge))
	s.Bridge = err == nil
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for l := range strings.SplitSeq(string(mi), "\n") {
			// mount ID, parent ID, major:minor, root, mount point, options, optional fields...
			if f := strings.Fields(l); len(f) > 6 && f[4] == "/sys/fs/bpf" {
				s.BPFShared = strings.Contains(strings.Join(f[6:], " "), "shared:")
			}
		}
	}
	for _, p := range []string{filepath.Join("/sys/class/net", EgressdDNSInterface), EgressdPinRoot} {
		if _, err := os.Lstat(p); err == nil {
			s.Egressd = append(s.Egressd, p)
		}
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		out, err := exec.Command(ipt + "-save").Output()
		if err != nil {
			continue
		}
		table := ""
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, "*"):
				table = l[1:]
			case strings.HasPrefix(l, ":") && nodeChain.MatchString(l[1:]):
				s.Chains = append(s.Chains, ipt+" "+table+" "+strings.Fields(l[1:])[0])
			}
		}
	}
	if out, err := exec.Command("ipset", "list", "-n").Output(); err == nil {
		for _, n := range strings.Fields(string(out)) {
			if strings.HasPrefix(n, "KUBE-") || strings.HasPrefix(n, "kube-router") {
				s.IPSets = append(s.IPSets, n)
			}
		}
	}
	conn, err := nftables.New()
	if err != nil {
		return s, fmt.Errorf("nftables: %w", err)
	}
	defer conn.CloseLasting()
	tables, err := conn.ListTables()
	if err != nil {
		return s, fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range tables {
		s.NFTTables = append(s.NFTTables, family(t.Family)+" "+t.Name)
	}
	slices.Sort(s.NFTTables)
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 && under(fields[4], StateDir, RunDir, "/var/lib/kubelet") {
				s.Mounts = append(s.Mounts, fields[4])
			}
		}
		f.Close()
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		if strings.Contains(cmd, StateDir+"/") || strings.Contains(cmd, RunDir+"/") {
			s.Processes = append(s.Processes, filepath.Base(filepath.Dir(p))+" "+cmd)
		}
	}
	return s, nil
}

// Diff lists what after has of the node that s (taken before the node started) did not:
// changed sysctls and host folders, kubepods cgroups, the bridge, the node's iptables
// chains and ipsets, nftables tables that were not there (except Airlock's own "airlock*"
// tables, which other tests create, but including the node's egressd's), what the node's
// egressd leaves, mounts and processes. Empty means clean.
func (s HostState) Diff(after HostState) []string {
	var d []string
	for _, k := range Sysctls {
		if s.Sysctls[k] != after.Sysctls[k] {
			d = append(d, fmt.Sprintf("sysctl %s is %q, was %q", k, after.Sysctls[k], s.Sysctls[k]))
		}
	}
	for _, p := range hostPaths {
		if s.Paths[p] != after.Paths[p] {
			d = append(d, fmt.Sprintf("%s exists: %v, before: %v", p, after.Paths[p], s.Paths[p]))
		}
	}
	for _, c := range after.Cgroups {
		d = append(d, "cgroup "+c)
	}
	if after.Bridge {
		d = append(d, "bridge "+Bridge)
	}
	if s.BPFShared != after.BPFShared {
		d = append(d, fmt.Sprintf("/sys/fs/bpf shared: %v, before: %v", after.BPFShared, s.BPFShared))
	}
	for _, p := range after.Egressd {
		d = append(d, "egressd's "+p)
	}
	for _, c := range added(s.Chains, after.Chains) {
		d = append(d, "chain "+c)
	}
	for _, c := range added(s.IPSets, after.IPSets) {
		d = append(d, "ipset "+c)
	}
	for _, t := range added(s.NFTTables, after.NFTTables) {
		if name := strings.Fields(t)[1]; name == EgressdNFTTable || !strings.HasPrefix(name, "airlock") {
			d = append(d, "nftables table "+t)
		}
	}
	for _, m := range after.Mounts {
		d = append(d, "mount "+m)
	}
	for _, p := range after.Processes {
		d = append(d, "process "+p)
	}
	return d
}

// added returns the members of b that are not in a.
func added(a, b []string) []string {
	var out []string
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	return out
}

// under reports whether path is one of roots or inside one.
func under(path string, roots ...string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// family names an nftables table family as nft(8) does.
func family(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}
