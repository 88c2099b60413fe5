#!/usr/bin/env bash
# Builds the pinned kube-apiserver and etcd that the Kubernetes tests run on loopback
# (controller-runtime envtest), from the Go module proxy, and caches them by version in
# $AIRLOCK_KUBE_ASSETS (default ~/.cache/airlock/kube/<version>). A second run with both
# binaries present costs nothing. Prints the assets folder on its last line.
#
# Cost measured on this 2-core machine with empty Go module and build caches: 5 min in
# all (0.85 GB of modules, 2.9 GB of build cache); with both binaries cached: 0.01 s.
# The versions are pinned because the module proxy here is filtered.
set -euo pipefail

KUBE_VERSION=v1.37.1      # k8s.io/kubernetes; its staging modules are v0.37.1
STAGING_VERSION=v0.37.1
ETCD_VERSION=v3.7.3
ASSETS=${AIRLOCK_KUBE_ASSETS:-${HOME}/.cache/airlock/kube/${KUBE_VERSION}-etcd${ETCD_VERSION}}
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "==> kube testenv: $*" >&2; }

mkdir -p "$ASSETS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -x $ASSETS/kube-apiserver ]]; then
	log "building kube-apiserver $KUBE_VERSION into $ASSETS (cold: about 5 min)"
	mkdir -p "$work/apiserver" && cd "$work/apiserver"
	go mod init airlock.local/kube-apiserver >/dev/null 2>&1
	go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
	kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod
	{
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		# Each staging module that kubernetes replaces with ./staging/... comes from the
		# proxy at the matching version instead.
		grep -oE '^\s*k8s.io/[a-z0-9-]+ => ./staging' "$kmod" | awk '{print $1}' | sort -u |
			while read -r m; do echo "replace $m => $m $STAGING_VERSION"; done
	} >>go.mod
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
	go mod tidy -e >/dev/null 2>&1 || true
	go build -trimpath -tags=providerless \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION" \
		-o "$ASSETS/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
	mv "$ASSETS/kube-apiserver.tmp" "$ASSETS/kube-apiserver"
fi

if [[ ! -x $ASSETS/etcd ]]; then
	log "building etcd $ETCD_VERSION into $ASSETS (cold: about 1 min)"
	mkdir -p "$work/etcd" && cd "$work/etcd"
	go mod init airlock.local/etcd >/dev/null 2>&1
	go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
	go build -trimpath -ldflags "-s -w" -o "$ASSETS/etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$ASSETS/etcd.tmp" "$ASSETS/etcd"
fi

log "kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION ready"
echo "$ASSETS"
