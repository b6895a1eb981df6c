# Shared helpers of the real-cluster harness (sourced).
RK_VERSION=${RK_VERSION:-v1.20.2}
RK_CACHE=${RK_CACHE:-/var/cache/dynmig-real-k8s/$RK_VERSION}
RK_STATE=${RK_STATE:-/var/lib/dynmig-real-k8s}
log() { printf '[real-k8s %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
