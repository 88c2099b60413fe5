#!/usr/bin/env bash
# Builds the pinned Kubernetes binaries the tests run, from the Go module proxy, and
# caches them by version in $AIRLOCK_KUBE_ASSETS (default ~/.cache/airlock/kube/<version>).
# A binary already in the cache is not built again. Prints the assets folder on its last
# line.
#
# Usage: deploy/kubernetes/testenv/build.sh [--node]
#   (none)   kube-apiserver and etcd: the API server the Kubernetes tests run on loopback
#            (controller-runtime envtest)
#   --node   also kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl,
#            kube-router (the NetworkPolicy controller) and CoreDNS (the cluster DNS): the
#            one-node cluster of up.sh
#
# Cost measured on this 2-core machine with empty Go module and build caches: 5 min for
# the API server and etcd (0.85 GB of modules, 2.9 GB of build cache); --node adds the
# figures in README.md. With every binary cached: 0.01 s.
# The versions are pinned because the module proxy here is filtered.
set -euo pipefail

KUBE_VERSION=v1.37.1      # k8s.io/kubernetes; its staging modules are v0.37.1
STAGING_VERSION=v0.37.1
ETCD_VERSION=v3.7.3
KUBE_ROUTER_VERSION=v2.1.0 # github.com/cloudnativelabs/kube-router/v2: NetworkPolicy (see README.md)
COREDNS_VERSION=v1.15.0    # github.com/coredns/coredns: the cluster DNS (kubernetes plugin)
ASSETS=${AIRLOCK_KUBE_ASSETS:-${HOME}/.cache/airlock/kube/${KUBE_VERSION}-etcd${ETCD_VERSION}}
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0 GOFLAGS=-mod=mod

node=0
for a in "$@"; do
	case "$a" in
	--node) node=1 ;;
	-h | --help) sed -n '2,17p' "$0"; exit 0 ;;
	*) echo "build.sh: unknown option $a (see --help)" >&2; exit 2 ;;
	esac
done

log() { echo "==> kube testenv: $*" >&2; }

# fetch COMMAND...: a download from the module proxy, tried 3 times (the proxy here has
# had minutes-long outages); its output is shown only when the last try fails.
fetch() {
	local try out
	for try in 1 2 3; do
		if out=$("$@" 2>&1 >/dev/null); then return 0; fi
		((try < 3)) && { log "$1 $2 failed (try $try of 3), again in $((try * 20)) s"; sleep $((try * 20)); }
	done
	echo "$out" >&2
	log "could not download from the Go module proxy: $*"
	return 1
}

mkdir -p "$ASSETS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The commands of k8s.io/kubernetes to build: the API server always, the node's with --node.
cmds=(kube-apiserver)
[[ $node == 1 ]] && cmds+=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)
missing=()
for c in "${cmds[@]}"; do [[ -x $ASSETS/$c ]] || missing+=("$c"); done

if ((${#missing[@]})); then
	log "building ${missing[*]} $KUBE_VERSION into $ASSETS (cold: about 5 min for the API server, see README.md for the rest)"
	mkdir -p "$work/kubernetes" && cd "$work/kubernetes"
	go mod init airlock.local/kubernetes >/dev/null 2>&1
	fetch go mod download "k8s.io/kubernetes@$KUBE_VERSION"
	kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod
	{
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		# Each staging module that kubernetes replaces with ./staging/... comes from the
		# proxy at the matching version instead.
		grep -oE '^\s*k8s.io/[a-z0-9-]+ => ./staging' "$kmod" | awk '{print $1}' | sort -u |
			while read -r m; do echo "replace $m => $m $STAGING_VERSION"; done
	} >>go.mod
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		for c in "${missing[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
		printf ')\n'
	} >tools.go
	go mod tidy -e >/dev/null 2>&1 || true
	pkgs=()
	for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	mkdir -p "$work/out"
	go build -trimpath -tags=providerless \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION" \
		-o "$work/out/" "${pkgs[@]}"
	for c in "${missing[@]}"; do mv "$work/out/$c" "$ASSETS/$c"; done
fi

if [[ ! -x $ASSETS/etcd ]]; then
	log "building etcd $ETCD_VERSION into $ASSETS (cold: about 1 min)"
	mkdir -p "$work/etcd" && cd "$work/etcd"
	go mod init airlock.local/etcd >/dev/null 2>&1
	fetch go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	go build -trimpath -ldflags "-s -w" -o "$ASSETS/etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$ASSETS/etcd.tmp" "$ASSETS/etcd"
fi

# The folder is named by the Kubernetes version; kube-router's own is checked in the binary.
router_version=$("$ASSETS/kube-router" --version 2>&1 || true)
if [[ $node == 1 && $router_version != *"version $KUBE_ROUTER_VERSION,"* ]]; then
	log "building kube-router $KUBE_ROUTER_VERSION into $ASSETS"
	mkdir -p "$work/kube-router" && cd "$work/kube-router"
	go mod init airlock.local/kube-router >/dev/null 2>&1
	fetch go get "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION"
	go build -trimpath -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
		-o "$ASSETS/kube-router.tmp" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
	mv "$ASSETS/kube-router.tmp" "$ASSETS/kube-router"
fi

# CoreDNS with only the plugins up.sh's Corefile uses (kubernetes, cache, errors, bind,
# ready, loadbalance), compiled into a small main of our own: the full build's cloud
# plugins would triple the compile time. Its version is checked in the binary.
dns_version=$("$ASSETS/coredns" -version 2>&1 || true)
if [[ $node == 1 && $dns_version != *"CoreDNS-${COREDNS_VERSION#v}"* ]]; then
	log "building CoreDNS $COREDNS_VERSION into $ASSETS (cold: about 3 min)"
	mkdir -p "$work/coredns" && cd "$work/coredns"
	go mod init airlock.local/coredns >/dev/null 2>&1
	cat >main.go <<-'EOF'
		// Command coredns is CoreDNS with the plugins of the one-node cluster's Corefile.
		package main

		import (
			_ "github.com/coredns/coredns/plugin/bind"
			_ "github.com/coredns/coredns/plugin/cache"
			_ "github.com/coredns/coredns/plugin/errors"
			_ "github.com/coredns/coredns/plugin/kubernetes"
			_ "github.com/coredns/coredns/plugin/loadbalance"
			_ "github.com/coredns/coredns/plugin/ready"

			"github.com/coredns/coredns/coremain"
		)

		func main() { coremain.Run() }
	EOF
	fetch go get "github.com/coredns/coredns@$COREDNS_VERSION"
	fetch go mod tidy
	go build -trimpath -ldflags "-s -w" -o "$ASSETS/coredns.tmp" .
	mv "$ASSETS/coredns.tmp" "$ASSETS/coredns"
fi

log "ready in $ASSETS: $(cd "$ASSETS" && ls | tr '\n' ' ')"
echo "$ASSETS"
