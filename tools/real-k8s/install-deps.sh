#!/usr/bin/env bash
# Installs what the real-cluster harness needs, from Debian only, and only what is missing:
#  - bookworm: etcd-server, containerd, runc, containernetworking-plugins, busybox-static, iproute2, openssl,
#    prometheus (the scenario whose alert fires: a real Prometheus scrapes dynmig)
#  - bullseye: golang-1.15-go (Kubernetes v1.20 does not build into a working apiserver with newer Go)
#  - the kubernetes source package (bookworm deb-src), downloaded into the build cache by build-k8s.sh
# Adds an apt source entry for bullseye (deb + deb-src) and a deb-src entry for bookworm, both copied
# from the machine's own Debian entry so that the same mirror is used. Quiet when everything is present.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

pkgs=(etcd-server containerd runc containernetworking-plugins busybox-static golang-1.15-go
  iproute2 openssl python3 python3-yaml dpkg-dev rsync jq prometheus)
missing=()
installed=$( (dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${pkgs[@]}" 2>/dev/null || true) |
  awk '$2=="installed"{print $1}')
for p in "${pkgs[@]}"; do grep -qx "$p" <<<"$installed" || missing+=("$p"); done

src_file=/etc/apt/sources.list.d/dynmig-real-k8s.sources
if [ ! -f "$src_file" ]; then
  # The machine's own Debian entry: the first URIs line that serves the main archive (not -security).
  uri=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    u=$(awk '/^URIs:/{print $2}' "$f" | grep -v -- '-security' | grep -i debian | head -n1 || true)
    [ -n "$u" ] && { uri=$u; break; }
  done
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^(http|https|file|ftp):/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || die "no Debian entry found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list to copy"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  log "adding apt entries (bullseye deb+deb-src, bookworm deb-src) for $uri to $src_file"
  cat >"$src_file" <<SRC
# Added by dynmig tools/real-k8s/install-deps.sh for the real-cluster suite.
Types: deb deb-src
URIs: $uri
Suites: bullseye
Components: main
Signed-By: $keyring

Types: deb-src
URIs: $uri
Suites: bookworm
Components: main
Signed-By: $keyring
SRC
  need_update=1
fi
# The source package must be known to apt (an update after the entry was added).
if [ -n "${need_update:-}" ] || ! apt-cache showsrc kubernetes >/dev/null 2>&1 || [ ${#missing[@]} -gt 0 ]; then
  log "apt-get update"
  apt-get update -qq >/dev/null
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# containerd's Debian service would start with the default config (which may pull); the harness runs
# its own containerd with a closed config, so the packaged service stays off.
if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
  log "stopping the packaged containerd service (the harness runs its own)"
  systemctl stop containerd || true
fi
