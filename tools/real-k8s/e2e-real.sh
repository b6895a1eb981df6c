#!/usr/bin/env bash
# `make e2e-real`: the scenario suite (tests/e2e-real/scenarios.py) on a real Kubernetes v1.20 on this machine.
#   1. Debian packages (install-deps.sh), 2. Kubernetes built from Debian's source package or taken from the
#   cache (build-k8s.sh), 3. control plane + kubelet on containerd (cluster.py up), 4. dynmig from deploy/
#   (cluster.py deploy), 5. the scenarios through real kubectl, 6. teardown, always (also on failure or Ctrl-C).
# `e2e-real.sh burst [burst.py options]` (`make e2e-real-burst`) runs tools/real-k8s/burst.py in step 5 instead.
# Prints the time of each phase. Needs root. build/bin/dynmig must exist (the Makefile target builds it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
mode=suite
if [ "${1:-}" = burst ]; then
  mode=burst
  shift
fi
[ "$(id -u)" -eq 0 ] || die "e2e-real needs root (containerd and the kubelet)"
PY=/usr/bin/python3
declare -A took
phase() { # NAME COMMAND...
  local name=$1 t0 rc=0
  shift
  t0=$EPOCHREALTIME
  "$@" || rc=$?
  took[$name]=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  log "phase $name: ${took[$name]} s (exit $rc)"
  return $rc
}
summary() {
  local p
  for p in deps k8s-build bring-up deploy suite burst teardown; do
    [ -n "${took[$p]:-}" ] && printf '  %-10s %8s s\n' "$p" "${took[$p]}" >&2
  done
  return 0
}
torn=0
teardown() {
  [ $torn -eq 1 ] && return 0
  torn=1
  phase teardown "$PY" "$here/cluster.py" down || true
}
on_exit() {
  local rc=$?
  trap '' INT TERM # a second Ctrl-C must not cut the teardown short (it would leave the cluster running)
  if [ $rc -ne 0 ] && [ -d "$RK_STATE/logs" ]; then
    log "failed (exit $rc): component logs follow"
    "$PY" "$here/cluster.py" logs --lines 30 || true
  fi
  teardown
  log "times:"
  summary
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

phase deps "$here/install-deps.sh"
phase k8s-build "$here/build-k8s.sh"
dynmig_bin=${RK_DYNMIG_BIN:-$repo/build/bin/dynmig} # RK_DYNMIG_BIN: another build of dynmig for the images
[ -x "$dynmig_bin" ] || die "$dynmig_bin is missing: run make build"
# A cluster left by an interrupted run is stopped first (down is idempotent).
"$PY" "$here/cluster.py" down >/dev/null 2>&1 || true
phase bring-up "$PY" "$here/cluster.py" up
phase deploy "$PY" "$here/cluster.py" deploy
if [ $mode = burst ]; then
  phase burst "$PY" "$here/burst.py" --kubeconfig "$RK_STATE/admin.kubeconfig" --kubectl "$RK_CACHE/bin/kubectl" \
    --node localhost --nvml-url http://127.0.0.1:19401/nvml "$@"
  exit
fi
phase suite "$PY" "$repo/tests/e2e-real/scenarios.py" --backend real --kubeconfig "$RK_STATE/admin.kubeconfig" \
  --kubectl "$RK_CACHE/bin/kubectl" --node localhost --nvml-url http://127.0.0.1:19401/nvml ${E2E_ONLY:+--only "$E2E_ONLY"}
