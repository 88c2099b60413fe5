#!/usr/bin/env bash
# Stops the one-node cluster up.sh started (`make kube-down`) and leaves the host as it
# was before: pods' containers and sandboxes gone, every process up.sh started stopped,
# kubelet's and containerd's mounts unmounted, the kubepods cgroups removed, the node's
# bridge and what Airlock's egressd left (its interface, tables and eBPF pins) deleted,
# the iptables chains, ipsets and nftables tables of kubelet, the CNI plugins,
# kube-proxy, kube-router and up.sh deleted, the sysctls put back to their saved values
# and the node's folders removed. Docker's rules and bridge are never touched.
#
# Usage: deploy/kubernetes/testenv/down.sh [--keep-logs DIR]
#   --keep-logs DIR  copy the components' logs to DIR first
# Idempotent: with nothing up it does nothing; after a partial up.sh it removes what is
# there. Exits 1, naming what is left, when the host is not clean at the end.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
export PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH

keep_logs=
case "${1:-}" in
--keep-logs) keep_logs=${2:?--keep-logs needs a folder} ;;
"") ;;
*) echo "down.sh: unknown option $1 (see the header)" >&2; exit 2 ;;
esac
[[ $EUID == 0 ]] || kube_die "must run as root"
began=$(date +%s.%N)
since() { echo "$(date +%s.%N) $1" | awk '{printf "%.1f s", $1 - $2}'; }

# The chain-name prefixes the node's components use in iptables: kubelet's canaries,
# kube-proxy's leftovers, kube-router's policies, the CNI portmap plugin and up.sh.
IPT_PREFIXES='KUBE-|CNI-|AIRLOCK-KUBE-'

if [[ -n $keep_logs && -d $KUBE_LOGS ]]; then
	mkdir -p "$keep_logs" && cp -a "$KUBE_LOGS/." "$keep_logs/"
fi

ASSETS=
[[ -f $KUBE_STATE/assets ]] && ASSETS=$(<"$KUBE_STATE/assets")

# stop [-KILL] NAME...: SIGTERM (or SIGKILL at once) to each that runs, up to 10 s for
# all to exit, then SIGKILL.
stop() {
	local name pid i t0 sig=TERM names=() pids=()
	if [[ $1 == -KILL ]]; then
		sig=KILL
		shift
	fi
	for name in "$@"; do
		pid=$(kube_pid "$name")
		rm -f "$KUBE_PIDS/$name.pid"
		[[ -n $pid ]] || continue
		names+=("$name") pids+=("$pid")
		kill -"$sig" "$pid" 2>/dev/null
	done
	((${#pids[@]})) || return 0
	t0=$(date +%s.%N)
	for ((i = 0; i < 150; i++)); do
		((i == 100)) && kill -KILL "${pids[@]}" 2>/dev/null
		alive=0
		# An exited process stays a zombie until init reaps it: that one is gone.
		for pid in "${pids[@]}"; do [[ $(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) =~ ^[^Z]$ ]] && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	((alive)) && echo "kube node: one of ${names[*]} (pids ${pids[*]}) did not exit" >&2
	kube_log "stopped ${names[*]} ($(since "$t0"))"
}

# --- pods: through the API and kubelet while they run ---------------------------------
if [[ -n $(kube_pid kube-apiserver) && -n $(kube_pid kubelet) && -n $(kube_pid containerd) && -x $ASSETS/kubectl ]]; then
	kube_log "deleting every pod (kubelet stops them and releases their network)"
	stop -KILL kube-controller-manager kube-scheduler # nothing creates pods again
	t0=$(date +%s.%N)
	"$ASSETS/kubectl" --kubeconfig "$KUBE_CONFIG" --request-timeout=20s delete pods --all \
		--all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1
	for ((i = 0; i < 120; i++)); do
		[[ -z $(kube_ctr tasks ls -q 2>/dev/null) ]] && break
		sleep 0.5
	done
	kube_log "pods stopped ($(since "$t0"))"
fi

# --- processes, in reverse start order ------------------------------------------------
# The node agents together, then the control plane (killed: all it keeps is in the state
# folder, which goes), then containerd (after the containers kubelet did not stop: their
# tasks killed, their containers deleted).
stop coredns kube-router kube-proxy kubelet
stop -KILL kube-scheduler kube-controller-manager kube-apiserver etcd
if [[ -S $KUBE_CONTAINERD_SOCK ]]; then
	for id in $(kube_ctr tasks ls -q 2>/dev/null); do kube_ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
	for ((i = 0; i < 20; i++)); do
		[[ -z $(kube_ctr tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"') ]] && break
		sleep 0.25
	done
	for id in $(kube_ctr tasks ls -q 2>/dev/null); do kube_ctr tasks delete -f "$id" >/dev/null 2>&1; done
	for id in $(kube_ctr containers ls -q 2>/dev/null); do kube_ctr containers delete "$id" >/dev/null 2>&1; done
fi
stop containerd

# Shims of the private containerd outlive it; so can the pods' processes. Both are found
# by what is certainly the node's: the shim's -address is our socket, the pod's cgroup is
# under kubepods.
node_pids() {
	local p exe cmd
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		case $exe in
		*/containerd | */containerd-shim* | */runc) ;;
		*) [[ -n $ASSETS && $exe == "$ASSETS"/* ]] || continue ;;
		esac
		cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)
		[[ $cmd == *"$KUBE_STATE/"* || $cmd == *"$KUBE_RUN/"* ]] && echo "${p#/proc/}"
	done
	cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
		/sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null
	return 0
}
# node_mounts: the mount points under the node's folders, deepest first.
node_mounts() {
	awk -v a="$KUBE_STATE" -v b="$KUBE_RUN" '$5 == a || index($5, a "/") == 1 || $5 == b || index($5, b "/") == 1 {print $5}' /proc/self/mountinfo | sort -r
}
shim_sockets=$(ss -xlpn 2>/dev/null | awk '/containerd-shim/ {print $5}' | grep '^/run/containerd/s/' || true)
pids=$(node_pids | sort -u)
if [[ -n $pids ]]; then
	kube_log "killing the node's leftover processes: $(echo $pids)"
	kill -KILL $pids 2>/dev/null
	sleep 0.5
fi
for s in $shim_sockets; do
	# A shim's socket stays behind when the shim is killed; only ours are gone now.
	ss -xlpn 2>/dev/null | grep -qF " $s " || rm -f "$s"
done

# --- mounts: kubelet's volumes and root, containerd's rootfs, shm and netns ------------
for ((i = 0; i < 3; i++)); do
	mounts=$(node_mounts)
	[[ -z $mounts ]] && break
	while read -r m; do
		m=$(printf '%b' "$m") # mountinfo writes a space as \040
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	done <<<"$mounts"
done

# --- cgroups ---------------------------------------------------------------------------
for d in /sys/fs/cgroup/*/kubepods; do
	[[ -d $d ]] || continue
	find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
done

# --- network: bridge, iptables chains, ipsets, nftables tables -------------------------
ip link del "$KUBE_BRIDGE" 2>/dev/null
# Airlock's egressd (overlays/testnode): its DNS address's interface, nftables tables and
# pinned eBPF state outlive it by design (enforcement survives a restart).
ip link del "$KUBE_EGRESSD_DNS_IF" 2>/dev/null
if command -v nft >/dev/null; then
	nft list tables 2>/dev/null | awk -v n="$KUBE_EGRESSD_NFT" '$3 == n {print $2}' |
		while read -r fam; do nft delete table "$fam" "$KUBE_EGRESSD_NFT"; done
fi
rm -rf "$KUBE_EGRESSD_PINS"
for ipt in iptables ip6tables; do
	for t in filter nat mangle raw; do
		rules=$($ipt-save -t "$t" 2>/dev/null) || continue
		# Rules in any chain that jump to one of the node's chains, then the chains.
		grep -E "^-A .* -j ($IPT_PREFIXES)" <<<"$rules" | grep -vE "^-A ($IPT_PREFIXES)" |
			while read -r rule; do eval "$ipt -w -t $t -D ${rule#-A }" 2>/dev/null; done
		chains=$(grep -oE "^:($IPT_PREFIXES)[^ ]*" <<<"$rules" | cut -c2-)
		for c in $chains; do $ipt -w -t "$t" -F "$c" 2>/dev/null; done
		for c in $chains; do $ipt -w -t "$t" -X "$c" 2>/dev/null; done
	done
done
if command -v ipset >/dev/null; then
	for s in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)'); do ipset destroy "$s" 2>/dev/null; done
fi
if command -v nft >/dev/null; then
	for t in "ip kube-proxy" "ip6 kube-proxy"; do
		nft list table $t >/dev/null 2>&1 && nft delete table $t
	done
	# iptables-nft creates a table (filter, nat, mangle...) on its first rule in it:
	# kubelet's canaries did so for tables the host did not have. Empty ones go.
	if [[ -f $KUBE_STATE/host.before ]]; then
		nft list tables | while read -r _ fam name; do
			[[ $fam == ip || $fam == ip6 ]] || continue
			[[ $name =~ ^(filter|nat|mangle|raw|security)$ ]] || continue
			grep -qxF "nfttable $fam $name" "$KUBE_STATE/host.before" && continue
			# Rules are the lines with a handle that open neither a table nor a chain.
			rules=$(nft -a list table "$fam" "$name" | grep '# handle' | grep -cvE '^\s*(table|chain) ')
			[[ $rules == 0 ]] && nft delete table "$fam" "$name"
		done
	fi
fi

# --- sysctls and files -----------------------------------------------------------------
before=$KUBE_STATE/host.before
if [[ -f $before ]]; then
	while read -r kind key value; do
		[[ $kind == sysctl ]] && sysctl -qw "$key=$value"
	done <"$before"
	# up.sh made a private /sys/fs/bpf shared (egressd's mount propagation).
	if grep -qx "bpffs private" "$before" && [[ $(findmnt -n -o PROPAGATION /sys/fs/bpf) != private ]]; then
		mount --make-private /sys/fs/bpf
	fi
	for p in /var/lib/cni /var/lib/kubelet /var/log/containers /var/log/pods /run/containerd; do
		grep -qxF "path $p" "$before" && continue
		[[ $p == /run/containerd && -n $(ls -A /run/containerd/s 2>/dev/null) ]] && continue # Docker's shims
		rm -rf "$p"
	done
	# On paths that were there: only the node's entries.
	rm -f /var/lib/cni/results/"$KUBE_CNI_NETWORK"-* 2>/dev/null
	find /var/log/containers -maxdepth 1 -lname "$KUBE_STATE/*" -delete 2>/dev/null
fi
rm -rf "$KUBE_RUN" "$KUBE_STATE"

# --- what is left ----------------------------------------------------------------------
left=()
[[ -n $(node_pids) ]] && left+=("processes: $(node_pids | sort -u | tr '\n' ' ')")
[[ -n $(node_mounts) ]] && left+=("mounts: $(node_mounts | tr '\n' ' ')")
ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && left+=("cgroups: $(ls -d /sys/fs/cgroup/*/kubepods | tr '\n' ' ')")
ip link show "$KUBE_BRIDGE" >/dev/null 2>&1 && left+=("bridge $KUBE_BRIDGE")
ip link show "$KUBE_EGRESSD_DNS_IF" >/dev/null 2>&1 && left+=("interface $KUBE_EGRESSD_DNS_IF")
[[ -e $KUBE_EGRESSD_PINS ]] && left+=("eBPF pins $KUBE_EGRESSD_PINS")
nft list tables 2>/dev/null | grep -q " $KUBE_EGRESSD_NFT\$" && left+=("nftables tables $KUBE_EGRESSD_NFT")
for ipt in iptables ip6tables; do
	c=$($ipt-save 2>/dev/null | grep -oE "^:($IPT_PREFIXES)[^ ]*" | tr '\n' ' ')
	[[ -n $c ]] && left+=("$ipt chains: $c")
done
nft list tables 2>/dev/null | grep -q ' kube-proxy$' && left+=("nftables table kube-proxy")
if ((${#left[@]})); then
	printf 'kube node: not clean after down: %s\n' "${left[@]}" >&2
	exit 1
fi
kube_log "down in $(since "$began"); host clean"
