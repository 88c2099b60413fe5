#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on this machine (`make kube-up`): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, a private containerd with the
# CRI plugin, ptp CNI, kubelet, kube-proxy (nftables mode), kube-router (NetworkPolicy
# only) and CoreDNS (the cluster DNS). Waits until the node is Ready and prints the admin kubeconfig's path on its last
# line. down.sh (`make kube-down`) undoes all of it. Needs root. See README.md.
#
# Usage: deploy/kubernetes/testenv/up.sh
# Running it again while the node runs prints the kubeconfig and changes nothing; after a
# partial start it runs down.sh first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:$PATH

[[ $EUID == 0 ]] || kube_die "must run as root (starts containerd, kubelet, changes netfilter and sysctls)"

PKI=$KUBE_STATE/pki
API=https://$KUBE_NODE_IP:$KUBE_API_PORT
start_time=$(date +%s.%N)

elapsed() { echo "$(date +%s.%N) $start_time" | awk '{printf "%.1f s", $1 - $2}'; }

# --- already up? -----------------------------------------------------------------------
all_running() {
	local c
	for c in "${KUBE_COMPONENTS[@]}"; do [[ -n $(kube_pid "$c") ]] || return 1; done
}
if [[ -d $KUBE_STATE ]]; then
	if all_running && curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" \
		--key "$PKI/admin.key" "$API/readyz" >/dev/null 2>&1; then
		kube_log "already up"
		echo "$KUBE_CONFIG"
		exit 0
	fi
	kube_log "a previous node is partly up: bringing it down first"
	"$here/down.sh" >&2
fi

# --- host packages ---------------------------------------------------------------------
# probe:package, as deploy/host/prepare.sh does it.
need=()
for entry in containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
	nft:nftables iptables:iptables ipset:ipset openssl:openssl ip:iproute2 curl:curl; do
	probe=${entry%%:*} pkg=${entry#*:}
	if [[ $probe == /* ]]; then [[ -e $probe ]] && continue; else command -v "$probe" >/dev/null && continue; fi
	need+=("$pkg")
done
if ((${#need[@]})); then
	kube_log "installing Debian packages the node needs: ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
		kube_die "could not install ${need[*]}; run: apt-get install ${need[*]}"
fi

# --- binaries (cached by version) ------------------------------------------------------
ASSETS=$(nice -n 15 "$here/build.sh" --node | tail -1)
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kube-router coredns; do
	[[ -x $ASSETS/$b ]] || kube_die "$ASSETS/$b missing after build.sh --node"
done
kubectl() { "$ASSETS/kubectl" --kubeconfig "$KUBE_CONFIG" --request-timeout=20s "$@"; }

mkdir -p "$KUBE_STATE" "$KUBE_LOGS" "$KUBE_PIDS" "$PKI" "$KUBE_RUN"
# The node's folders for the gateway and lifecycle pods' audit logs (the testnode
# overlay's hostPaths), owned by their user (65532, non-root): each pod writes
# <pod name>/audit there.
install -d -o 65532 -g 65532 -m 0700 "$KUBE_STATE/gateway" "$KUBE_STATE/lifecycle"
trap 'rc=$?; ((rc == 0)) || echo "kube node: up.sh failed (exit $rc): the node is partly up; logs in $KUBE_LOGS; make kube-down (or up.sh again) removes it" >&2' EXIT
echo "$ASSETS" >"$KUBE_STATE/assets"

# What the host had before, so down.sh removes only what the node added.
{
	for s in "${KUBE_SYSCTLS[@]}"; do echo "sysctl $s $(sysctl -n "$s")"; done
	for p in /var/lib/cni /var/lib/kubelet /var/log/containers /var/log/pods /run/containerd; do
		if [[ -e $p ]]; then echo "path $p"; fi
	done
	nft list tables | sed 's/^table /nfttable /'
	echo "bpffs $(findmnt -n -o PROPAGATION /sys/fs/bpf 2>/dev/null || echo none)"
} >"$KUBE_STATE/host.before"

# --- certificates ----------------------------------------------------------------------
kube_log "certificates in $PKI"
# The cluster's CA, and the front proxy's (the API server's aggregation layer) apart.
for ca in ca front-proxy-ca; do
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
		-subj "/CN=airlock-kube-$ca" -keyout "$PKI/$ca.key" -out "$PKI/$ca.crt" 2>/dev/null
done
# cert NAME SUBJECT EXTENDED-KEY-USAGE [SUBJECT-ALT-NAMES [CA]]
cert() {
	local name=$1 subj=$2 eku=$3 san=${4:-} ca=${5:-ca}
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		if [[ -n $san ]]; then echo "subjectAltName=$san"; fi
	} >"$PKI/$name.ext"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
		-keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
		-days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}
cert apiserver "/CN=kube-apiserver" serverAuth \
	"IP:$KUBE_NODE_IP,IP:127.0.0.1,IP:$KUBE_API_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert kubelet "/CN=$KUBE_NODE_NAME" serverAuth "IP:$KUBE_NODE_IP,IP:127.0.0.1,DNS:$KUBE_NODE_NAME"
cert admin "/O=system:masters/CN=airlock-kube-admin" clientAuth
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert node "/O=system:nodes/CN=system:node:$KUBE_NODE_NAME" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
cert kube-router "/CN=airlock-kube:kube-router" clientAuth
cert coredns "/CN=airlock-kube:coredns" clientAuth
cert front-proxy-client "/CN=front-proxy-client" clientAuth "" front-proxy-ca
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

# kubeconfig FILE CERT-NAME: a kubeconfig for the API server with that client certificate.
kubeconfig() {
	cat >"$1" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: airlock-kube
		  cluster:
		    server: $API
		    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
		users:
		- name: $2
		  user:
		    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
		    client-key-data: $(base64 -w0 "$PKI/$2.key")
		contexts:
		- name: airlock-kube
		  context: {cluster: airlock-kube, user: $2}
		current-context: airlock-kube
	EOF
	chmod 600 "$1"
}
kubeconfig "$KUBE_CONFIG" admin
for c in controller-manager scheduler node kube-proxy kube-router coredns; do kubeconfig "$KUBE_STATE/$c.kubeconfig" "$c"; done

# --- processes -------------------------------------------------------------------------
# start NAME COMMAND...: runs COMMAND in its own session, output in logs/NAME.log, with
# no file descriptor of the caller's beyond those three (the shared test lock's among
# them: a daemon that kept it would hold the lock after the test, and containerd would
# hand it on to every container).
start() {
	local name=$1 fd
	shift
	(
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			((fd > 2)) && eval "exec $fd>&-"
		done
		setsid "$@" >>"$KUBE_LOGS/$name.log" 2>&1 </dev/null &
		echo $! >"$KUBE_PIDS/$name.pid"
	)
}

# wait_for WHAT SECONDS LOG COMMAND...: polls COMMAND every 0.5 s; on timeout prints the
# end of logs/LOG.log and fails.
wait_for() {
	local what=$1 secs=$2 name=$3
	shift 3
	local deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		if [[ -n $name && -z $(kube_pid "$name") ]]; then
			tail -n 30 "$KUBE_LOGS/$name.log" >&2 || true
			kube_die "$name exited while waiting for $what (log: $KUBE_LOGS/$name.log)"
		fi
		if (($(date +%s) > deadline)); then
			[[ -n $name ]] && { tail -n 30 "$KUBE_LOGS/$name.log" >&2 || true; }
			kube_die "timed out after ${secs}s waiting for $what${name:+ (log: $KUBE_LOGS/$name.log)}"
		fi
		sleep 0.5
	done
	kube_log "$what ($(elapsed))"
}
https_ok() { curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$1"; }

# --- bpffs: shared, as on a systemd node ----------------------------------------------
# egressd's DaemonSet mounts /sys/fs/bpf with mountPropagation HostToContainer, which the
# runtime refuses on a private mount (this host has no systemd, whose mounts are shared).
# down.sh makes it private again.
if ! mountpoint -q /sys/fs/bpf; then
	mount -t bpf bpf /sys/fs/bpf # as deploy/host/prepare.sh does; left mounted
fi
[[ $(findmnt -n -o PROPAGATION /sys/fs/bpf) == private ]] && mount --make-shared /sys/fs/bpf

# --- host network: sysctls, the node's address, forwarding ----------------------------
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# The node's address lives on a bridge without ports (this kernel has no dummy driver):
# pods are not bridged, each has its own veth (the ptp CNI plugin below), but the /24
# keeps traffic to a pod address that has no pod on this host instead of the default
# route.
ip link add "$KUBE_BRIDGE" type bridge
ip addr add "$KUBE_NODE_IP/${KUBE_POD_CIDR#*/}" dev "$KUBE_BRIDGE"
ip link set "$KUBE_BRIDGE" up
# Docker sets the FORWARD policy to DROP; pods talk to each other through this chain,
# appended after Docker's rules (never changing them) and after kube-router's chain
# (first in FORWARD), which rejects what a NetworkPolicy denies. Only pod-to-pod traffic
# is accepted: pods reach only each other and this host.
iptables -w -N "$KUBE_FWD_CHAIN"
iptables -w -A "$KUBE_FWD_CHAIN" -s "$KUBE_POD_CIDR" -d "$KUBE_POD_CIDR" -j ACCEPT
iptables -w -A FORWARD -m comment --comment "airlock kube node" -j "$KUBE_FWD_CHAIN"

# --- containerd (private) and CNI ------------------------------------------------------
mkdir -p "$KUBE_STATE/cni/net.d" "$KUBE_STATE/cni/ipam" "$KUBE_RUN/containerd"
# ptp: each pod gets its own veth, the host side carrying the gateway address and a /32
# route to the pod. egressd finds a pod's veth from that route (a routed CNI, like Calico);
# kube-router matches the routed traffic in FORWARD by the pods' addresses.
cat >"$KUBE_STATE/cni/net.d/10-$KUBE_CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$KUBE_CNI_NETWORK",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$KUBE_STATE/cni/ipam",
        "ranges": [[{"subnet": "$KUBE_POD_CIDR", "gateway": "$KUBE_NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
cat >"$KUBE_STATE/containerd.toml" <<EOF
version = 2
root = "$KUBE_STATE/containerd"
state = "$KUBE_RUN/containerd"

[grpc]
  address = "$KUBE_CONTAINERD_SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$KUBE_STATE/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$KUBE_PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE on this machine: without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$KUBE_STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$KUBE_RUN/runc"
EOF
kube_log "containerd (private: $KUBE_CONTAINERD_SOCK)"
start containerd containerd --config "$KUBE_STATE/containerd.toml"
wait_for "containerd answers" 30 containerd kube_ctr version

# The pause image: built from ./pause, written as a docker-archive tarball, cached by
# the hash of its source next to the binaries.
pause_hash=$(sha256sum "$here/pause/main.go" | cut -c1-16)
pause_tar=$ASSETS/kube-pause-$pause_hash.tar
if [[ ! -f $pause_tar ]]; then
	kube_log "building the pause image"
	img=$(mktemp -d)
	(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$img/rootfs/pause" ./deploy/kubernetes/testenv/pause)
	"$here/image-tar.sh" "$img/rootfs" /pause "$KUBE_PAUSE_IMAGE" "$pause_tar.tmp"
	mv "$pause_tar.tmp" "$pause_tar"
	find "$ASSETS" -maxdepth 1 -name 'kube-pause-*.tar' ! -name "${pause_tar##*/}" -delete
	rm -rf "$img"
fi
kube_ctr images import "$pause_tar" >/dev/null
kube_log "imported $KUBE_PAUSE_IMAGE"

# --- control plane ---------------------------------------------------------------------
kube_log "etcd on 127.0.0.1:$KUBE_ETCD_PORT"
start etcd "$ASSETS/etcd" --name airlock-kube --data-dir "$KUBE_STATE/etcd" --unsafe-no-fsync \
	--listen-client-urls "http://127.0.0.1:$KUBE_ETCD_PORT" \
	--advertise-client-urls "http://127.0.0.1:$KUBE_ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$((KUBE_ETCD_PORT + 1))" \
	--initial-advertise-peer-urls "http://127.0.0.1:$((KUBE_ETCD_PORT + 1))" \
	--initial-cluster "airlock-kube=http://127.0.0.1:$((KUBE_ETCD_PORT + 1))"
wait_for "etcd healthy" 30 etcd curl -fsS "http://127.0.0.1:$KUBE_ETCD_PORT/health"

kube_log "kube-apiserver on $API"
start kube-apiserver "$ASSETS/kube-apiserver" \
	--etcd-servers "http://127.0.0.1:$KUBE_ETCD_PORT" \
	--bind-address "$KUBE_NODE_IP" --advertise-address "$KUBE_NODE_IP" --secure-port "$KUBE_API_PORT" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range "$KUBE_SERVICE_CIDR" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--allow-privileged=true \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types InternalIP,Hostname \
	--requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
	--requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
	--requestheader-extra-headers-prefix X-Remote-Extra- \
	--proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key"
wait_for "kube-apiserver ready" 90 kube-apiserver https_ok "$API/readyz"

# kube-router reads what its NetworkPolicy controller needs, nothing more.
kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "airlock-kube:kube-router"}
rules:
- apiGroups: [""]
  resources: [namespaces, pods, services, endpoints, nodes]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "airlock-kube:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "airlock-kube:kube-router"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "airlock-kube:kube-router"}
EOF

kube_log "kube-controller-manager and kube-scheduler on 127.0.0.1"
start kube-controller-manager "$ASSETS/kube-controller-manager" \
	--kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
	--authorization-kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--use-service-account-credentials=true --service-cluster-ip-range "$KUBE_SERVICE_CIDR"
start kube-scheduler "$ASSETS/kube-scheduler" \
	--kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
	--authentication-kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
	--authorization-kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false
wait_for "kube-controller-manager healthy" 60 kube-controller-manager curl -fsSk https://127.0.0.1:10257/healthz
wait_for "kube-scheduler healthy" 60 kube-scheduler curl -fsSk https://127.0.0.1:10259/healthz

# --- the node --------------------------------------------------------------------------
cat >"$KUBE_STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KUBE_NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
# This host mixes cgroup v1 controllers with a cgroup v2 mount; kubelet 1.37 refuses v1
# unless told, and the private containerd runs runc with cgroupfs.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$KUBE_CONTAINERD_SOCK
clusterDNS: [$KUBE_DNS_IP]
clusterDomain: cluster.local
failSwapOn: false
podLogsDir: $KUBE_STATE/pod-logs
# Images come from ctr import, never from a registry: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
rotateCertificates: false
EOF
kube_log "kubelet (node $KUBE_NODE_NAME, $KUBE_NODE_IP)"
start kubelet "$ASSETS/kubelet" --config "$KUBE_STATE/kubelet.yaml" \
	--kubeconfig "$KUBE_STATE/node.kubeconfig" --root-dir "$KUBE_STATE/kubelet" \
	--hostname-override "$KUBE_NODE_NAME" --node-ip "$KUBE_NODE_IP"

cat >"$KUBE_STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBE_STATE/kube-proxy.kubeconfig}
mode: nftables
hostnameOverride: $KUBE_NODE_NAME
clusterCIDR: $KUBE_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
# Leave the host's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
EOF
node_ready() {
	[[ $(kubectl get node "$KUBE_NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
wait_for "kubelet healthy" 60 kubelet curl -fsS http://127.0.0.1:10248/healthz
wait_for "node $KUBE_NODE_NAME Ready" 90 kubelet node_ready

# kube-router reads its node (address, name) at start: after the node registered.
kube_log "kube-proxy (nftables) and kube-router (NetworkPolicy)"
start kube-proxy "$ASSETS/kube-proxy" --config "$KUBE_STATE/kube-proxy.yaml"
start kube-router "$ASSETS/kube-router" --kubeconfig "$KUBE_STATE/kube-router.kubeconfig" \
	--run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
	--enable-ipv4=true --enable-ipv6=false --hostname-override "$KUBE_NODE_NAME" \
	--service-cluster-ip-range "$KUBE_SERVICE_CIDR" --health-port 0 --metrics-port 0

wait_for "kube-proxy healthy" 60 kube-proxy curl -fsS http://127.0.0.1:10256/healthz
wait_for "kube-router's NetworkPolicy chains" 60 kube-router iptables -w -n -L KUBE-ROUTER-FORWARD
wait_for "default ServiceAccount" 60 kube-controller-manager kubectl -n default get serviceaccount default

# --- cluster DNS -----------------------------------------------------------------------
# CoreDNS runs on the host, on the node's address only (never :53 of every interface:
# egressd answers sandboxes on its own address), and reads the API with its own client
# certificate. The kube-dns Service has no selector: its EndpointSlice names the node's
# address, so kube-proxy sends the clusterDNS address (pods, and hostNetwork pods with
# dnsPolicy ClusterFirstWithHostNet) there.
kube_log "CoreDNS on $KUBE_NODE_IP:53 (Service kube-dns, $KUBE_DNS_IP)"
kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "airlock-kube:coredns"}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "airlock-kube:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "airlock-kube:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "airlock-kube:coredns"}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $KUBE_DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-node
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: airlock-kube
addressType: IPv4
endpoints:
- addresses: [$KUBE_NODE_IP]
  conditions: {ready: true}
  nodeName: $KUBE_NODE_NAME
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
EOF
cat >"$KUBE_STATE/Corefile" <<EOF
.:53 {
    bind $KUBE_NODE_IP
    errors
    ready 127.0.0.1:$KUBE_DNS_READY_PORT
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBE_STATE/coredns.kubeconfig airlock-kube
        pods disabled
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
EOF
start coredns "$ASSETS/coredns" -conf "$KUBE_STATE/Corefile"
wait_for "CoreDNS ready" 60 coredns curl -fsS "http://127.0.0.1:$KUBE_DNS_READY_PORT/ready"

kube_log "node up in $(elapsed); kubectl --kubeconfig $KUBE_CONFIG get pods -A"
echo "$KUBE_CONFIG"
