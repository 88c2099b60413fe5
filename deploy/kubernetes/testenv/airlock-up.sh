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
# builds it), GO (default go).
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
"${GO:-go}" run ./deploy/kubernetes/testenv/deploy -kubeconfig "$KUBE_CONFIG" -sandbox-image "$sandbox"
