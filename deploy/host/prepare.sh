#!/usr/bin/env bash
# Prepares this host for Airlock: the Debian packages it uses, a running Docker engine
# with gVisor's runsc registered as runtime "runsc", the BPF filesystem. Every need is probed by the thing Airlock actually uses (the engine
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
#   AIRLOCK_DOCKER_DAEMON_JSON  the engine's configuration file (default: /etc/docker/daemon.json)
#   AIRLOCK_DOCKERD_PIDFILE the engine's pid file, signalled to reload it without systemd
#                           (default: /var/run/docker.pid)
set -euo pipefail

want_node=1
plan=0
for a in "$@"; do
  case "$a" in
    --no-node) want_node=0 ;;
    --plan) plan=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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
daemon_json=${AIRLOCK_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
dockerd_pidfile=${AIRLOCK_DOCKERD_PIDFILE:-/var/run/docker.pid}
# runsc's arguments as the engine's runtime "runsc" (lifecycle/docker/README.md#gvisor):
# --network=host, because Debian 12's runsc (2022-12) refuses its own network stack on
# kernels from 6.11 on (gVisor issue 10704); the sandbox still has its own network
# namespace (Docker's), which gVisor enters.
runsc_args=(--network=host)

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
  runsc:runsc                # gVisor, the runtime of docker.runtime: runsc (registered below)
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
  git:git                    # tests: egressd's git smart-HTTP server (git http-backend)
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

# runsc_configured: 0 when daemon.json names a runtime "runsc" (whatever its arguments:
# an operator's own entry is left alone).
# Bash matching only: the probes run before any package is installed.
runsc_configured() {
  [ -f "$daemon_json" ] || return 1
  local re='"runsc"[[:space:]]*:'
  [[ "$(<"$daemon_json")" =~ $re ]]
}

# gVisor: name runsc in daemon.json before the engine starts, so a first start has it;
# a running engine is reloaded below. `runsc install` merges into the file, keeping
# every other key.
if runsc_configured; then
  [ "$plan" = 1 ] && say "ok runtime runsc in $daemon_json"
elif [ "$plan" = 1 ]; then
  say "add runtime runsc (${runsc_args[*]}) to $daemon_json"
else
  say "adding runtime runsc (${runsc_args[*]}) to $daemon_json"
  mkdir -p "${daemon_json%/*}"
  runsc install --config_file="$daemon_json" --runtime=runsc -- "${runsc_args[@]}" >/dev/null 2>&1 ||
    die "could not add runsc to $daemon_json (is it valid JSON?); run: runsc install --config_file=$daemon_json -- ${runsc_args[*]}"
  runsc_configured || die "runsc install left no runtime runsc in $daemon_json"
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

# engine_has_runsc: 0 when the engine lists runtime "runsc" (GET /info, Runtimes).
engine_has_runsc() {
  [ -S "$socket" ] || return 1
  local info
  info=$(curl -fsS --max-time 5 --unix-socket "$socket" http://localhost/info 2>/dev/null) || return 1
  [[ "$info" == *'"runsc":{'* ]]
}

# reload_engine makes the engine re-read daemon.json (runtimes are reloadable): systemd's
# reload when systemd runs it, else SIGHUP to the pid in its pid file.
reload_engine() {
  if [ -d /run/systemd/system ] && systemctl cat docker.service >/dev/null 2>&1; then
    systemctl reload docker || die "systemctl reload docker failed; run: journalctl -u docker -n 50"
    return
  fi
  local pid
  pid=$(cat "$dockerd_pidfile" 2>/dev/null || true)
  [ -n "$pid" ] && kill -HUP "$pid" 2>/dev/null ||
    die "cannot signal the engine to reload $daemon_json (no live pid in $dockerd_pidfile); restart dockerd"
}

if [ "$plan" = 1 ]; then
  if engine_answers && engine_has_runsc; then say "ok engine lists runtime runsc"
  else say "reload the engine so it lists runtime runsc"; fi
elif engine_has_runsc; then
  say "docker engine lists runtime runsc"
else
  say "reloading the docker engine for runtime runsc"
  reload_engine
  for _ in $(seq 1 20); do engine_has_runsc && break; sleep 0.5; done
  engine_has_runsc || die "the engine does not list runtime runsc after reloading $daemon_json; see ${dockerd_pid:+$dockerd_log}${dockerd_pid:-its log}"
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
