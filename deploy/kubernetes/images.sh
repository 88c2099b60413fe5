#!/usr/bin/env bash
# Builds the two images the Kubernetes manifests run, from static binaries, without a
# base image or a registry (docker import of a minimal root), then optionally pushes
# them:
#   airlock/airlock:<version>  /airlock: lifecycle, gateway and egressd
#   airlock/execd:<version>    /execd: each sandbox pod's init container copies it in
#                              (built by `airlock image build execd`)
# Usage: deploy/kubernetes/images.sh [REGISTRY]
#   with REGISTRY (e.g. registry.example.com), the images are also tagged
#   REGISTRY/airlock/airlock:<version> and REGISTRY/airlock/execd:<version> and pushed.
# Environment: VERSION (default 0.1.0, the tag the manifests name), GO (default go).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=${VERSION:-0.1.0}
GO=${GO:-go}
registry=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ldflags="-s -w -X github.com/airlockdev/airlock/internal/buildinfo.Version=$VERSION"
# image NAME BINARY PACKAGE: a root with the static binary, /tmp and CA certificates.
image() {
	local name=$1 bin=$2 pkg=$3 root=$work/$1
	mkdir -p "$root/tmp" "$root/etc/ssl/certs"
	chmod 1777 "$root/tmp"
	CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldflags" -o "$root/$bin" "$pkg"
	if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
		cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
	fi
	printf 'root:x:0:0:root:/:/airlock\nnonroot:x:65532:65532:nonroot:/tmp:/airlock\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
	tar -C "$root" -c . | docker import \
		--change "ENTRYPOINT [\"/$bin\"]" --change 'USER 65532:65532' --change 'WORKDIR /tmp' \
		- "airlock/$name:$VERSION" >/dev/null
	echo "built airlock/$name:$VERSION"
	if [ -n "$registry" ]; then
		docker tag "airlock/$name:$VERSION" "$registry/airlock/$name:$VERSION"
		docker push "$registry/airlock/$name:$VERSION"
	fi
}
image airlock airlock ./cmd/airlock
# The execd image is the one `airlock image build execd` makes (one recipe).
CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldflags" -o "$work/execd-bin/execd" ./cmd/execd
"$work/airlock/airlock" image build execd --execd "$work/execd-bin/execd"
if [ -n "$registry" ]; then
	docker tag "airlock/execd:$VERSION" "$registry/airlock/execd:$VERSION"
	docker push "$registry/airlock/execd:$VERSION"
fi
