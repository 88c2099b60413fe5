#!/usr/bin/env bash
# Prepares this host for Airlock: the Debian packages it uses, a running Docker engine,
# the BPF filesystem. Every need is probed by the thing Airlock actually uses (the engine
# is dockerd + containerd + runc answering on its socket, never a docker client that
# happens to be on the PATH); what is present is left alone. Idempotent. Needs root,
# except with --plan.
#
# Usage: deploy/host/prepare.sh [--no-node] [--plan]
#   --no-node   skip Node.js and npm (only the SDK tests need them)
#   --plan      print the decisions (one line per probe) and change nothing
#
# Environment (for tests and unusual hosts):
#   AIRLOCK_DOCKER_SOCKET   the engine's socket (default: DOCKER_HOST when unix://, else
#                           /var/run/docker.sock)
#   AIRLOCK_PREPARE_ROOT    prefix for the file probes (default: none)
#   AIRLOCK_PREPARE_MOUNTS  the mount table read for bpffs (default: /proc/self/mounts)
set -euo pipefail

want_node=1
plan=0
for a in "$@"; do
  case "$a" in
    --no-node) want_node=0 ;;
    --plan) plan=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "prepare: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done

root_prefix=${AIRLOCK_PREPARE_ROOT:-}
mounts=${AIRLOCK_PREPARE_MOUNTS:-/proc/self/mounts}
socket=${AIRLOCK_DOCKER_SOCKET:-}
if [ -z "$socket" ]; then
  case "${DOCKER_HOST:-}" in
    unix://*) socket=${DOCKER_HOST#unix://} ;;
    *) socket=/var/run/docker.sock ;;
  esac
fi
dockerd_log=/var/log/airlock-dockerd.log

say() { if [ "$plan" = 1 ]; then printf 'plan: %s\n' "$*"; else printf '\033[1m==> %s\033[0m\n' "$*"; fi; }
die() { echo "prepare: $*" >&2; exit 1; }

if [ "$plan" = 0 ] && [ "$EUID" -ne 0 ]; then
  die "must run as root (installs packages, starts the Docker engine, mounts bpffs); --plan shows what it would do"
fi

# What Airlock uses -> the Debian package that provides it. A probe is a command looked
# up on the PATH, or a path (leading /) that must exist. Order is the order printed.
probes=(
  dockerd:docker.io          # the engine (lifecycle's Docker runtime talks to it)
  containerd:containerd      # the engine's container supervisor
  runc:runc                  # the OCI runtime the engine starts sandboxes with
  docker:docker.io           # the CLI, used by tests and operators only
  curl:curl                  # prepare's own engine probe; the image recipe
  debootstrap:debootstrap    # airlock image build
  chroot:coreutils
  tar:tar
  clang:clang                # make generate: the eBPF programs
  llvm-strip:llvm
  /usr/include/bpf/bpf_helpers.h:libbpf-dev
  ip:iproute2                # tests: network namespaces and veths
  openssl:openssl            # SDK tests: the vault suite's test CA
  git:git
  gcc:gcc                    # go test -race
  chromium:chromium          # console browser tests (chromedp drives headless Chromium)
  /usr/lib/cni/bridge:containernetworking-plugins  # the one-node cluster (deploy/kubernetes/testenv)
  nft:nftables               # the one-node cluster: kube-proxy's nftables mode
  ipset:ipset                # the one-node cluster: kube-router's NetworkPolicy
)
if [ "$want_node" = 1 ]; then
  probes+=(node:nodejs npm:npm)  # the OpenSandbox JavaScript SDK tests
fi

# present PROBE: 0 when the probe finds the thing.
present() {
  local p=$1
  if [[ "$p" == /* ]]; then [ -e "$root_prefix$p" ]; else command -v "$p" >/dev/null 2>&1; fi
}

declare -A want=()
order=()
for entry in "${probes[@]}"; do
  probe=${entry%%:*} pkg=${entry#*:}
  if present "$probe"; then
    [ "$plan" = 1 ] && say "ok $probe"
    continue
  fi
  [ "$plan" = 1 ] && say "install $pkg ($probe not found)"
  if [ -z "${want[$pkg]:-}" ]; then order+=("$pkg"); fi
  want[$pkg]+="${want[$pkg]:+, }$probe"
done

if [ "$plan" = 0 ]; then
  if [ ${#order[@]} -gt 0 ]; then
    say "installing system packages: ${order[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed; run: apt-get update && apt-get install ${order[*]}"
    apt-get install -y -qq --no-install-recommends "${order[@]}" >/dev/null ||
      die "could not install ${order[*]}; run: apt-get install ${order[*]}"
    # Check what was needed, not what apt said: a package can install without the tool.
    for entry in "${probes[@]}"; do
      probe=${entry%%:*} pkg=${entry#*:}
      present "$probe" || die "$probe is still missing after installing $pkg; run: apt-get install --reinstall $pkg"
    done
  else
    say "system packages present"
  fi
fi

# engine_answers: 0 when the engine answers /_ping on its socket (what the Go client
# does first). Uses curl, never the docker CLI: a client of any version proves nothing.
engine_answers() {
  [ -S "$socket" ] || return 1
  command -v curl >/dev/null 2>&1 || return 1
  [ "$(curl -fsS --max-time 2 --unix-socket "$socket" http://localhost/_ping 2>/dev/null)" = OK ]
}

engine_version() {
  curl -fsS --max-time 2 --unix-socket "$socket" http://localhost/version 2>/dev/null |
    sed -n 's/.*"Version":"\([^"]*\)".*"ApiVersion":"\([^"]*\)".*/\1, API \2/p' | head -1
}

if engine_answers; then
  if [ "$plan" = 1 ]; then say "ok engine answering on $socket"; else say "docker engine answering ($(engine_version))"; fi
elif [ "$plan" = 1 ]; then
  if [ -d /run/systemd/system ]; then say "start the engine (systemctl start docker; not answering on $socket)"
  else say "start the engine (dockerd, log in $dockerd_log; not answering on $socket)"; fi
else
  if [ -d /run/systemd/system ] && systemctl cat docker.service >/dev/null 2>&1; then
    say "starting the docker engine (systemctl start docker)"
    systemctl start docker || die "systemctl start docker failed; run: journalctl -u docker -n 50"
  else
    say "starting dockerd (no systemd; log in $dockerd_log)"
    nohup dockerd >"$dockerd_log" 2>&1 &
    dockerd_pid=$!
  fi
  for _ in $(seq 1 60); do
    engine_answers && break
    if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
      die "dockerd exited at start: $(tail -1 "$dockerd_log" 2>/dev/null); see $dockerd_log"
    fi
    sleep 0.5
  done
  engine_answers || die "the docker engine did not answer on $socket within 30 s; see ${dockerd_pid:+$dockerd_log}${dockerd_pid:-journalctl -u docker}"
  say "docker engine answering ($(engine_version))"
fi

# BPF filesystem, for pinned programs and maps (/sys/fs/bpf/airlock).
bpffs=0
while read -r _ dir fstype _; do
  if [ "$dir" = /sys/fs/bpf ] && [ "$fstype" = bpf ]; then bpffs=1; fi
done <"$mounts"
if [ "$bpffs" = 1 ]; then
  [ "$plan" = 1 ] && say "ok bpffs on /sys/fs/bpf"
elif [ "$plan" = 1 ]; then
  say "mount bpffs on /sys/fs/bpf"
else
  say "mounting bpffs on /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf || die "cannot mount bpffs; run: mount -t bpf bpf /sys/fs/bpf"
fi
exit 0
