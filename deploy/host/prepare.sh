#!/usr/bin/env bash
# Prepares this host for Airlock: system packages, a running Docker engine, the BPF
# filesystem. Idempotent: every step checks first and says what it does. Needs root.
#
# Usage: deploy/host/prepare.sh [--no-node]
#   --no-node   skip Node.js (only the SDK tests need it)
set -euo pipefail

want_node=1
for a in "$@"; do
  case "$a" in
    --no-node) want_node=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "prepare: unknown option $a" >&2; exit 2 ;;
  esac
done

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "prepare: must run as root (installs packages, starts dockerd, mounts bpffs)" >&2
  exit 1
fi

# Packages: command or file that proves presence -> Debian package.
declare -A need=(
  [docker]=docker.io
  [debootstrap]=debootstrap
  [clang]=clang
  [llvm-strip]=llvm
  [/usr/include/bpf/bpf_helpers.h]=libbpf-dev
  [ip]=iproute2
  [curl]=curl
  [git]=git
  [gcc]=gcc
)
if [ "$want_node" = 1 ]; then
  need[node]=nodejs
  need[npm]=npm
fi
missing=()
for probe in "${!need[@]}"; do
  if [[ "$probe" == /* ]]; then [ -e "$probe" ] && continue
  else command -v "$probe" >/dev/null 2>&1 && continue; fi
  missing+=("${need[$probe]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  say "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "system packages present"
fi

# Docker engine.
if docker info >/dev/null 2>&1; then
  say "docker engine answering"
else
  if [ -d /run/systemd/system ]; then
    say "starting docker (systemctl)"
    systemctl start docker
  else
    say "starting dockerd (no systemd; log in /var/log/airlock-dockerd.log)"
    nohup dockerd >/var/log/airlock-dockerd.log 2>&1 &
  fi
  for i in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    echo "prepare: dockerd did not answer within 30 s; see /var/log/airlock-dockerd.log" >&2
    tail -20 /var/log/airlock-dockerd.log >&2 || true
    exit 1
  fi
  say "docker engine answering ($(docker version --format '{{.Server.Version}}'))"
fi

# BPF filesystem, for pinned programs and maps (/sys/fs/bpf/airlock).
if ! mountpoint -q /sys/fs/bpf; then
  say "mounting bpffs on /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
