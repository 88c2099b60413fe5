#!/usr/bin/env bash
# Vendors xterm.js for the console's terminal (console/assets/xterm/): fetches the pinned
# npm packages with `npm pack`, checks each tarball against its pinned sha512 integrity
# (as package-lock.json would), and copies the files the console serves, byte for byte:
#
#   @xterm/xterm      lib/xterm.mjs, css/xterm.css, LICENSE (as xterm.LICENSE)
#   @xterm/addon-fit  lib/addon-fit.mjs, LICENSE (as addon-fit.LICENSE)
#
# then writes their SHA-256 sums to console/thirdparty/xterm.sha256, which the Go test
# console/xterm_test.go checks against the committed files.
#
#   console/thirdparty/xterm.sh          # (re)vendor the pinned versions
#   console/thirdparty/xterm.sh --check  # fetch again and fail when the committed files differ
#
# To upgrade: change the versions and integrities below (npm view PKG@VER dist.integrity),
# run the script, test the terminal (go test ./console -run TestBrowserTerminal).
set -euo pipefail

XTERM_VERSION=6.0.0
XTERM_INTEGRITY=sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==
FIT_VERSION=0.11.0
FIT_INTEGRITY=sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==

here=$(cd "$(dirname "$0")" && pwd)
assets=$here/../assets/xterm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch() { # name version integrity -> extracted under $tmp/<name>
	local name=$1 version=$2 integrity=$3 tgz got
	tgz=$(cd "$tmp" && npm pack --silent --loglevel=error "$name@$version")
	got="sha512-$(openssl dgst -sha512 -binary "$tmp/$tgz" | base64 -w0)"
	if [[ "$got" != "$integrity" ]]; then
		echo "xterm.sh: $name@$version integrity $got, pinned $integrity" >&2
		exit 1
	fi
	mkdir -p "$tmp/${name##*/}"
	tar -xzf "$tmp/$tgz" -C "$tmp/${name##*/}" --strip-components=1
}
fetch @xterm/xterm "$XTERM_VERSION" "$XTERM_INTEGRITY"
fetch @xterm/addon-fit "$FIT_VERSION" "$FIT_INTEGRITY"

out=$tmp/out
mkdir -p "$out"
cp "$tmp/xterm/lib/xterm.mjs" "$tmp/xterm/css/xterm.css" "$out/"
cp "$tmp/xterm/LICENSE" "$out/xterm.LICENSE"
cp "$tmp/addon-fit/lib/addon-fit.mjs" "$out/"
cp "$tmp/addon-fit/LICENSE" "$out/addon-fit.LICENSE"
sums=$(cd "$out" && sha256sum -- * | sed "1i # @xterm/xterm@$XTERM_VERSION @xterm/addon-fit@$FIT_VERSION (console/thirdparty/xterm.sh)")

if [[ "${1:-}" == "--check" ]]; then
	diff -r "$out" "$assets" && diff <(echo "$sums") "$here/xterm.sha256" && echo "xterm.sh: console/assets/xterm matches the pinned packages"
	exit
fi
rm -rf "$assets"
mkdir -p "$assets"
cp "$out"/* "$assets/"
echo "$sums" >"$here/xterm.sha256"
echo "xterm.sh: vendored @xterm/xterm@$XTERM_VERSION and @xterm/addon-fit@$FIT_VERSION into console/assets/xterm"
