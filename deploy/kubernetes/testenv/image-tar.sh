#!/usr/bin/env bash
# Writes a one-layer image (FROM scratch) as a docker-archive tarball, the format
# `docker save` writes and `ctr images import` reads: no Docker engine and no registry.
#
# Usage: deploy/kubernetes/testenv/image-tar.sh ROOTFS ENTRYPOINT NAME OUT.tar
#   ROOTFS      a folder whose content is the image's root filesystem (owned by root)
#   ENTRYPOINT  the program to run, an absolute path inside ROOTFS
#   NAME        the image reference, for example airlock.local/kube-pause:1
set -euo pipefail

[[ $# == 4 ]] || { sed -n '2,8p' "$0" >&2; exit 2; }
rootfs=$1 entrypoint=$2 name=$3 out=$4
[[ -x $rootfs$entrypoint ]] || { echo "image-tar: $rootfs$entrypoint is not executable" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Reproducible: fixed owner and time, sorted names.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$dir/layer.tar" .
layer=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
mkdir "$dir/$layer"
mv "$dir/layer.tar" "$dir/$layer/layer.tar"
printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":["%s"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$(go env GOARCH 2>/dev/null || echo amd64)" "$entrypoint" "$layer" >"$dir/config.json"
config=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
mv "$dir/config.json" "$dir/$config.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config" "$name" "$layer" >"$dir/manifest.json"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf "$out" manifest.json "$config.json" "$layer"
