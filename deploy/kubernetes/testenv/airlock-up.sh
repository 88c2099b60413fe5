#!/usr/bin/env bash
# Deploys Airlock on the running one-node cluster (`make kube-up`, after up.sh) from its
# own manifests, the overlay deploy/kubernetes/overlays/testnode: builds the airlock and
# execd images (../images.sh), imports them and the sandbox image into the node's
# containerd (import-image.sh, no registry), then applies the overlay and waits for the
# rollouts (./deploy, internal/kubedeploy). Prints the lifecycle API address, the
# gateway address and the API key as `airlock up` does. Needs root. See README.md.
#
# Usage: deploy/kubernetes/testenv/airlock-up.sh
# Environment: AIRLOCK_KUBE_SANDBOX_IMAGE (default airlock/sandbox:0.1.0; `make image`
# builds it), GO (default go), AIRLOCK_KUBE_UPSTREAM_CA (optional, for tests: a PEM file
# on this host, copied into egressd's hostPath folder and named by an extra
# --upstream-ca-file of egressd, which then trusts it for intercepted upstreams; unset
# by `make kube-up`).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
export PATH=/usr/local/go/bin:$PATH

[[ $EUID == 0 ]] || kube_die "must run as root (the node's containerd socket is root's)"
[[ -S $KUBE_CONTAINERD_SOCK && -f $KUBE_CONFIG ]] || kube_die "the one-node cluster is not up: deploy/kubernetes/testenv/up.sh"
VERSION=0.1.0 # the tag the manifests name (base/kustomization.yaml, settings.env)
sandbox=${AIRLOCK_KUBE_SANDBOX_IMAGE:-airlock/sandbox:$VERSION}
[[ $sandbox == *:latest || $sandbox != *:* ]] && kube_die "$sandbox: a :latest image is always pulled; name another tag"
docker image inspect "$sandbox" >/dev/null 2>&1 || kube_die "no Docker image $sandbox: make image"

cd "$repo"
kube_log "building airlock/airlock:$VERSION and airlock/execd:$VERSION"
VERSION=$VERSION deploy/kubernetes/images.sh >&2
"$here/import-image.sh" "airlock/airlock:$VERSION" "airlock/execd:$VERSION" "$sandbox"
extra=()
if [[ -n ${AIRLOCK_KUBE_UPSTREAM_CA:-} ]]; then
	[[ -f $AIRLOCK_KUBE_UPSTREAM_CA ]] || kube_die "AIRLOCK_KUBE_UPSTREAM_CA: no file $AIRLOCK_KUBE_UPSTREAM_CA"
	# The testnode overlay's egressd hostPath (/var/lib/airlock in its pod); down.sh
	# removes it with the node's state.
	install -D -m 0644 "$AIRLOCK_KUBE_UPSTREAM_CA" "$KUBE_STATE/egressd/upstream-ca.pem"
	extra=(-upstream-ca-file /var/lib/airlock/upstream-ca.pem)
fi
"${GO:-go}" run ./deploy/kubernetes/testenv/deploy -kubeconfig "$KUBE_CONFIG" -sandbox-image "$sandbox" "${extra[@]}"
