#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl (upstream v1.20.2,
# from Debian's `kubernetes` source package) with Go 1.15 into $RK_CACHE/bin, outside the work tree.
# A second run finds the binaries there and returns at once. Run install-deps.sh first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
have_all() { for b in "${bins[@]}"; do [ -x "$RK_CACHE/bin/$b" ] || return 1; done; [ -f "$RK_CACHE/bin/.complete" ]; }

mkdir -p "$RK_CACHE"
exec 9>"$RK_CACHE/.build.lock"
flock 9 # one build at a time; a second caller waits for the first and then finds the cache
if have_all; then
  log "Kubernetes $RK_VERSION binaries cached in $RK_CACHE/bin"
  exit 0
fi
go_root=/usr/lib/go-1.15
[ -x "$go_root/bin/go" ] || die "Go 1.15 is missing ($go_root/bin/go): run tools/real-k8s/install-deps.sh"

start=$(date +%s)
src="$RK_CACHE/src"
mkdir -p "$src"
orig=$(ls "$src"/kubernetes_*.orig.tar.* 2>/dev/null | head -n1 || true)
if [ -z "$orig" ]; then
  log "downloading Debian's kubernetes source package into $src"
  (cd "$src" && apt-get source --download-only kubernetes >/dev/null 2>"$src/apt-source.err") ||
    die "apt-get source --download-only kubernetes failed (is the deb-src entry there? $(tail -n3 "$src/apt-source.err"))"
  orig=$(ls "$src"/kubernetes_*.orig.tar.* | head -n1)
fi
tree="$src/tree"
if [ ! -f "$tree/.extracted" ]; then
  log "extracting $(basename "$orig")"
  rm -rf "$tree" && mkdir -p "$tree"
  tar -xf "$orig" -C "$tree" --strip-components=1
  touch "$tree/.extracted"
fi
[ -f "$tree/Makefile" ] || die "$tree has no Makefile: unexpected tarball layout"
cat >"$src/version.env" <<VER
KUBE_GIT_VERSION=${RK_VERSION}
KUBE_GIT_MAJOR=1
KUBE_GIT_MINOR=20
KUBE_GIT_TREE_STATE=clean
KUBE_GIT_COMMIT=0000000000000000000000000000000000000000
VER
log "building ${bins[*]} with Go 1.15 (4-20 minutes; log: $RK_CACHE/build.log)"
export PATH="$go_root/bin:$PATH" GOROOT="$go_root" GOCACHE="$RK_CACHE/gocache" GOPROXY=off GOFLAGS=-mod=vendor
export KUBE_GIT_VERSION_FILE="$src/version.env"
what="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl"
if ! (cd "$tree" && make WHAT="$what" >"$RK_CACHE/build.log" 2>&1); then
  tail -n 40 "$RK_CACHE/build.log" >&2
  die "Kubernetes build failed (full log: $RK_CACHE/build.log)"
fi
mkdir -p "$RK_CACHE/bin"
for b in "${bins[@]}"; do
  f="$tree/_output/local/bin/linux/amd64/$b"
  [ -x "$f" ] || f="$tree/_output/bin/$b"
  [ -x "$f" ] || die "the build did not produce $b"
  install -m 0755 "$f" "$RK_CACHE/bin/$b"
done
touch "$RK_CACHE/bin/.complete"
log "Kubernetes $RK_VERSION built in $(($(date +%s) - start)) s: $("$RK_CACHE/bin/kube-apiserver" --version)"
