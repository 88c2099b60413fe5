# Shared settings of the one-node test cluster (sourced by up.sh, down.sh and
# import-image.sh; not run on its own). Every name, address and path the node uses is
# here, so down.sh removes exactly what up.sh made. See README.md.

KUBE_STATE=${AIRLOCK_KUBE_STATE:-/var/lib/airlock-kube} # certificates, etcd, kubelet, containerd root, logs, pids
KUBE_RUN=${AIRLOCK_KUBE_RUN:-/run/airlock-kube}         # containerd's socket and state, runc's state, pod netns
[[ $KUBE_STATE == /*/* && $KUBE_RUN == /*/* ]] || {
	echo "kube node: AIRLOCK_KUBE_STATE and AIRLOCK_KUBE_RUN must be absolute paths below /" >&2
	exit 2
}
KUBE_CONFIG=$KUBE_STATE/kubeconfig                       # admin (system:masters) kubeconfig
KUBE_LOGS=$KUBE_STATE/logs
KUBE_PIDS=$KUBE_STATE/pids

KUBE_BRIDGE=airlockkube0         # holds the node's address (a bridge without ports; pods are ptp veths)
KUBE_POD_CIDR=10.244.0.0/24      # pod addresses (host-local IPAM)
KUBE_NODE_IP=10.244.0.1          # the bridge's address: node IP, API server, kubelet, CoreDNS; every pod's gateway
KUBE_SERVICE_CIDR=10.96.0.0/16   # ClusterIPs (kube-proxy, nftables mode)
KUBE_API_SERVICE_IP=10.96.0.1    # the "kubernetes" Service
KUBE_DNS_IP=10.96.0.10           # kubelet's clusterDNS: the kube-dns Service, to CoreDNS on KUBE_NODE_IP:53
KUBE_DNS_READY_PORT=10054        # CoreDNS's ready plugin, 127.0.0.1
KUBE_NODE_NAME=localhost         # resolvable, so pods/log and exec reach the kubelet
KUBE_API_PORT=6443               # on KUBE_NODE_IP
KUBE_ETCD_PORT=12379             # etcd client, 127.0.0.1 (peer: KUBE_ETCD_PORT+1)
KUBE_CNI_NETWORK=airlock-kube    # the CNI network name (host-local keeps its leases under KUBE_STATE)
KUBE_FWD_CHAIN=AIRLOCK-KUBE-FWD  # iptables filter chain accepting pod-to-pod traffic
KUBE_PAUSE_IMAGE=airlock.local/kube-pause:1
# What Airlock's egressd (overlays/testnode) leaves on the host, removed by down.sh.
KUBE_EGRESSD_PINS=/sys/fs/bpf/airlock-kube  # --pin-root
KUBE_EGRESSD_NFT=airlockkube                # --nft-table (inet and netdev tables)
KUBE_EGRESSD_DNS_IF=airlockkube-dns         # --dns-interface (holds AIRLOCK_DNS, 169.254.20.10)
KUBE_CONTAINERD_SOCK=$KUBE_RUN/containerd/containerd.sock

# The sysctls kubelet (and up.sh: forwarding, bridge netfilter) may change; down.sh puts
# back the values saved before the first start.
KUBE_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
	net.bridge.bridge-nf-call-iptables)

# The processes up.sh starts, in start order; down.sh stops them in reverse.
KUBE_COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
	kube-proxy kube-router coredns)

kube_log() { echo "==> kube node: $*" >&2; }
kube_die() {
	echo "kube node: $*" >&2
	exit 1
}

# kube_ctr runs ctr against the node's private containerd (never Docker's), namespace k8s.io.
kube_ctr() { ctr --address "$KUBE_CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# kube_pid NAME: the recorded pid of a component when that process still runs the same
# command line, else nothing.
kube_pid() {
	local f=$KUBE_PIDS/$1.pid pid
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	[[ -r /proc/$pid/cmdline ]] || return 0
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$1" && echo "$pid"
	return 0
}
