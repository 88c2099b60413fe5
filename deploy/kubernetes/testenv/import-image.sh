#!/usr/bin/env bash
# Copies local Docker images into the one-node cluster's containerd (no registry):
# `docker save` piped into `ctr -n k8s.io images import` on the node's private socket.
# Pods then run them with `imagePullPolicy: Never` (or IfNotPresent with a tag other than
# latest). A name without a registry, like airlock/sandbox:latest, is docker.io/airlock/
# sandbox:latest in containerd, which is also how kubelet spells the pod's image.
#
# Usage: deploy/kubernetes/testenv/import-image.sh IMAGE[=NAME]... | --tar FILE...
#   IMAGE       a Docker image reference (from `docker images`)
#   IMAGE=NAME  also tagged NAME in the node (for example a :latest image under another
#               tag, which kubelet then does not try to pull)
#   --tar FILE  docker-archive or OCI tarballs instead (for example from image-tar.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

[[ $EUID == 0 ]] || kube_die "must run as root (the node's containerd socket is root's)"
(($#)) || { sed -n '2,12p' "$0" >&2; exit 2; }
[[ -S $KUBE_CONTAINERD_SOCK ]] || kube_die "the node's containerd is not running ($KUBE_CONTAINERD_SOCK): make kube-up"

if [[ $1 == --tar ]]; then
	shift
	for f in "$@"; do
		kube_ctr images import "$f" >/dev/null
		kube_log "imported $f"
	done
	exit 0
fi
# full NAME: the reference as containerd (and kubelet) spell it: docker.io/library/x:latest.
full() {
	local ref=$1 first=${1%%/*}
	[[ ${ref##*/} == *[:@]* ]] || ref=$ref:latest
	if [[ $ref != */* ]]; then
		ref=docker.io/library/$ref
	elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
		ref=docker.io/$ref
	fi
	echo "$ref"
}
for arg in "$@"; do
	img=${arg%%=*}
	docker image inspect "$img" >/dev/null 2>&1 || kube_die "no Docker image $img (docker images)"
	docker save "$img" | kube_ctr images import - >/dev/null
	if [[ $arg == *=* ]]; then
		kube_ctr images tag --force "$(full "$img")" "$(full "${arg#*=}")" >/dev/null
		kube_log "imported $img as ${arg#*=}"
	else
		kube_log "imported $img"
	fi
done
